"""Where a loaded dlr-serve spends its time: py-spy samples of the server under real-time streams.

Starts `dlr-serve` (benchmarks/load_server.Server, shipped models unless --models-dir), runs N
real-time speech streams (load_server.speech_stream: 20 ms PCM chunks) and, while they run,
samples the server process with `py-spy record --format raw` (every thread, native frames off).
Then it folds the samples into:

- the share of samples per layer of the stack (by the innermost frame that belongs to a known
  layer: DLR math in dlr_runtime/, the scheduler, session code, WebSocket/ASGI protocol, JSON,
  asyncio's loop itself, ...);
- the top functions by self time and by inclusive time.

    nice -n 10 .venv/bin/python -m benchmarks.profile_server --streams 64 --seconds 20 \
        --results benchmarks/RESULTS.md

Needs py-spy (dev extra) and the right to ptrace the child (root, or ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import append_results, md_table
from benchmarks.load_server import ROOT, Server, speech_phase

# (layer, substring of "function (file)") in match order: the first layer found walking the
# stack from the innermost frame outwards takes the sample.
LAYERS: tuple[tuple[str, str], ...] = (
    ("JSON encode/decode", "json/"),
    ("JSON encode/decode", "orjson"),
    ("DLR math (dlr_runtime)", "dlr_runtime/"),
    ("torch (outside dlr_runtime)", "torch/"),
    ("numpy", "numpy/"),
    ("scheduler / engine thread", "server/scheduler"),
    ("scheduler / engine thread", "server/work"),
    ("speech session", "server/sessions/speech"),
    ("other session code", "server/sessions/"),
    ("other server code", "server/"),
    ("WebSocket protocol (websockets)", "websockets/"),
    ("WebSocket protocol (wsproto)", "wsproto/"),
    ("ASGI / uvicorn", "uvicorn/"),
    ("ASGI / starlette", "starlette/"),
    ("ASGI / fastapi", "fastapi/"),
    ("asyncio event loop", "asyncio/"),
    ("asyncio event loop", "uvloop"),
    ("threading / queues", "threading.py"),
    ("threading / queues", "queue.py"),
)


@dataclass
class Profile:
    samples: int
    layers: collections.Counter[str]
    self_time: collections.Counter[str]
    inclusive: collections.Counter[str]


def layer_of(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost first
        for layer, key in LAYERS:
            if key in frame:
                return layer
    return "other"


def fold(raw: str) -> Profile:
    """Fold py-spy's raw (collapsed) output: `frame;frame;...;innermost count` per line."""
    layers: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        layers[layer_of(frames)] += n
        self_time[_short(frames[-1])] += n
        for f in set(map(_short, frames)):
            inclusive[f] += n
    return Profile(total, layers, self_time, inclusive)


def _short(frame: str) -> str:
    """`send (starlette/websockets.py:160)` -> `send (starlette/websockets.py)`."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3", str(ROOT) + "/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})"


def run(args: argparse.Namespace) -> tuple[Profile, dict]:
    models = args.models_dir or ROOT / "models"
    srv = Server(models, args.max_batch_size, 1, ["--partial-interval-ms", "100"])
    out = Path(tempfile.mkdtemp()) / "profile.txt"
    try:
        spy = subprocess.Popen(
            [
                args.py_spy,
                "record",
                "--pid",
                str(srv.proc.pid),
                "--rate",
                str(args.rate),
                "--duration",
                str(int(args.seconds)),
                "--format",
                "raw",
                "--output",
                str(out),
                "--nonblocking",
                *(["--gil"] if args.gil else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        phase = asyncio.run(speech_phase(srv, args.streams, args.seconds, paced=True))
        _, err = spy.communicate(timeout=args.seconds + 60)
        if spy.returncode != 0:
            raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
    finally:
        srv.stop()
    return fold(out.read_text()), phase


def report(prof: Profile, phase: dict, args: argparse.Namespace) -> str:
    share = lambda n: 100.0 * n / max(prof.samples, 1)  # noqa: E731
    layers = md_table(
        ["layer (innermost known frame)", "% of samples"],
        [[k, share(v)] for k, v in prof.layers.most_common()],
    )
    top_self = md_table(
        ["function (self time)", "%"],
        [[f"`{k}`", share(v)] for k, v in prof.self_time.most_common(args.top)],
    )
    top_incl = md_table(
        ["function (inclusive)", "%"],
        [[f"`{k}`", share(v)] for k, v in prof.inclusive.most_common(args.top)],
    )
    load = (
        f"{args.streams} real-time streams x {args.seconds:g} s (20 ms pcm_f32le chunks, partials"
        f" every 100 ms): chunk latency p50 {phase['p50_ms']:.0f} ms, p99 {phase['p99_ms']:.0f}"
        f" ms, mean audio batch {phase['batch_audio']:.1f}, server RSS {phase['rss_mb']:.0f} MB;"
        f" {prof.samples} samples of the server process at {args.rate} Hz"
        + (" (the thread holding the GIL only)." if args.gil else " (all threads, idle excluded).")
    )
    return "\n\n".join([load, layers, top_self, top_incl])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=15)
    p.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL (Python work; torch ops release it)",
    )
    p.add_argument(
        "--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    )
    p.add_argument("--results", default=None)
    args = p.parse_args()
    prof, phase = run(args)
    body = report(prof, phase, args)
    print(body)
    title = "Server profile under real-time streams (profile_server" + (
        ", GIL)" if args.gil else ")"
    )
    append_results(args.results, title, body)


if __name__ == "__main__":
    main()
