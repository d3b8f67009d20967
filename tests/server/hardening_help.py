"""Black-box helpers for the hardening tests: a real `dlr-serve` process and what can be observed
of it from outside (HTTP, WebSocket, /proc), plus crafted state blobs.

- `serve(tmp_path, models_dir, **settings)`: `dlr-serve` as a subprocess on a free loopback
  port, importing this checkout (PYTHONPATH), with the given `DLR_*` settings.
- `Probe`: polls `/healthz` from a thread; `max_rtt` is the event loop's worst stall while it ran.
- `vm(pid)`: the process's VmRSS / VmHWM in bytes.
- `metric(srv, name, **labels)`, `eventually(pred, timeout)`: condition waits, never sleeps.
- `craft(blob, ...)`: a blob with its header or payload changed and a valid sha256 (anyone can
  recompute it), for crafted-state tests. Exported blobs are signed envelopes (server/store/
  signing.py): the servers started here share `TEST_SECRET`, and `craft` re-signs the crafted
  snapshot with it, so these tests check what holds even against a holder of the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from server.settings import Settings
from server.store import signing
from tests.server.live import LiveServer

MAGIC = b"DLRSTATE"
TEST_SECRET = "hardening-tests-state-secret"


class ServerProcess(LiveServer):
    """A started `dlr-serve` subprocess; `with` on it only stops it at the end."""

    def __enter__(self) -> ServerProcess:
        return self if self.proc is not None else self.start()


def serve(tmp_path: Path, models_dir: Path, name: str = "srv", **settings) -> ServerProcess:
    """Start `dlr-serve` (this checkout, defaults as in production but for the tiny models,
    the CPU and unthrottled partials) and wait until it is ready."""
    base = dict(
        models_dir=models_dir,
        device="cpu",
        partial_interval_ms=0,
        log_level="info",
        state_secret=TEST_SECRET,
    )
    srv = ServerProcess(
        Settings(**(base | settings)), process=True, log_path=tmp_path / f"{name}.log"
    )
    srv.start()
    return srv


def eventually(pred: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """True as soon as `pred()` is truthy; False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def metric(srv: ServerProcess, name: str, **labels: str) -> float:
    """Sum of the samples of metric `name` whose labels include `labels` (0 if none)."""
    text = httpx.get(srv.http + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric_name = head.split("{", 1)[0]
        if metric_name != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def sessions(srv: ServerProcess) -> int:
    return int(httpx.get(srv.http + "/readyz", timeout=10).json()["sessions"])


def idle(srv: ServerProcess) -> bool:
    """No session and no pool slot in use (what a fresh server shows)."""
    return sessions(srv) == 0 and metric(srv, "dlr_pool_slots_in_use") == 0


def vm(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of process `pid`, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(line.split()[1]) * 1024
    return out


class Probe:
    """Measure `/healthz` round trips from a thread while the body of a `with` runs."""

    def __init__(self, srv: ServerProcess, every_s: float = 0.02) -> None:
        self.url = srv.http + "/healthz"
        self.every_s = every_s
        self.rtts: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    c.get(self.url)
                except httpx.HTTPError:
                    self.failures += 1
                self.rtts.append(time.perf_counter() - t0)
                self._stop.wait(self.every_s)

    @property
    def max_rtt(self) -> float:
        return max(self.rtts, default=float("inf"))

    def __enter__(self) -> Probe:
        self._thread.start()
        eventually(lambda: self.rtts, 30, interval=0.005)  # measuring before the body starts
        return self

    def __exit__(self, *exc) -> None:
        n = len(self.rtts)
        eventually(lambda: len(self.rtts) > n, 30, interval=0.005)  # one round trip after
        self._stop.set()
        self._thread.join(timeout=60)


# ---------------------------------------------------------------------- crafted blobs
def split_blob(blob: bytes) -> tuple[dict, bytes]:
    """(header dict, payload bytes) of a state blob."""
    hlen = struct.unpack_from("<I", blob, len(MAGIC) + 4)[0]
    start = len(MAGIC) + 8
    return json.loads(blob[start : start + hlen]), blob[start + hlen : -32]


def craft(
    blob: bytes,
    header: Callable[[dict], None] | None = None,
    payload: Callable[[dict, bytearray], None] | None = None,
    raw_header: bytes | None = None,
) -> bytes:
    """`blob` with `header(h)` / `payload(h, bytes)` applied (or the header replaced by
    `raw_header`), re-framed with a valid sha256."""
    if blob.startswith(signing.MAGIC):  # a signed envelope: craft the snapshot inside, re-sign
        _, _, hlen, nbytes = signing._PREFIX.unpack_from(blob)
        start = signing._PREFIX.size + hlen
        inner = craft(blob[start : start + nbytes], header, payload, raw_header)
        body = (
            signing._PREFIX.pack(signing.MAGIC, signing.ENVELOPE_VERSION, hlen, len(inner))
            + blob[signing._PREFIX.size : start]
            + inner
        )
        return body + hmac.new(TEST_SECRET.encode(), body, hashlib.sha256).digest()
    h, body = split_blob(blob)
    data = bytearray(body)
    if payload is not None:
        payload(h, data)
    if header is not None:
        header(h)
    raw = raw_header if raw_header is not None else json.dumps(h).encode()
    framed = blob[: len(MAGIC) + 4] + struct.pack("<I", len(raw)) + raw + bytes(data)
    return framed + hashlib.sha256(framed).digest()


def set_field(path: str, value) -> Callable[[dict], None]:
    """A header mutation setting the dotted `path` (list indices as numbers) to `value`."""

    def mutate(h: dict) -> None:
        *keys, last = path.split(".")
        o = h
        for k in keys:
            o = o[int(k)] if isinstance(o, list) else o.setdefault(k, {})
        if isinstance(o, list):
            o[int(last)] = value
        else:
            o[last] = value

    return mutate


def poke_float32(tensor: str, value: float, index: int = 0) -> Callable[[dict, bytearray], None]:
    """A payload mutation writing float32 `value` at element `index` of `tensor`'s bytes."""

    def mutate(h: dict, data: bytearray) -> None:
        spec = next(t for t in h["tensors"] if t["name"] == tensor)
        struct.pack_into("<f", data, spec["offset"] + 4 * index, value)

    return mutate
