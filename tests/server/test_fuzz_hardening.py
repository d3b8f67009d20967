"""Fuzzing the shapes of the hardening issue against a real `dlr-serve` process (hypothesis):
odd sample rates, crafted state-blob headers (valid sha256), and clients that close early.

Invariants: no 5xx, the process stays up, the event loop never stalls for long, memory stays
bounded, and once the clients are gone no session or slot is left in use (the resume grace is
1 s here), so a fresh client is always served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import numpy as np
import pytest
import websockets
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.server.hardening_help import Probe, craft, eventually, idle, serve, set_field, vm
from tests.server.test_hardening import (
    DANGEROUS,
    WS_KW,
    arun,
    export_blob,
    sine,
    start_speech,
    stream_speech,
    until_closed_or,
)
from tests.server.wshelp import SPEECH, TEXT, s16, send_json

pytestmark = pytest.mark.slow  # fuzzing: the slow lane

MiB = 1 << 20


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: the server keeps state
    )


@pytest.fixture(scope="module")
def fsrv(tmp_path_factory, models_dir):
    tmp = tmp_path_factory.mktemp("fuzz-hardening")
    with serve(tmp, models_dir, max_sessions=8, resume_grace_s=1, idle_timeout_s=10) as s:
        arun(stream_speech(s.ws, sine(16000, 0.3), 16000))
        yield s


def _settled(srv) -> None:
    assert srv.proc.poll() is None, srv.log()
    assert eventually(lambda: idle(srv), 20), "sessions or slots left in use"


# ---------------------------------------------------------------------- odd sample rates
@DANGEROUS
def test_fuzz_odd_sample_rates(fsrv):
    """Any rate the protocol accepts, awkward ones favoured: a final of the right duration,
    loop stalls < 1 s, and peak RSS over the whole run grows < 150 MiB."""
    _settled(fsrv)
    rss0 = vm(fsrv.proc.pid)["VmRSS"]
    awkward = st.sampled_from([1001, 4001, 8001, 11021, 44101, 96001, 191999, 383999])

    @fuzz(20)
    @given(rate=st.integers(1000, 384000) | awkward, chunk_ms=st.sampled_from([10, 37, 100]))
    def one(rate: int, chunk_ms: int) -> None:
        with Probe(fsrv) as probe:
            final = arun(stream_speech(fsrv.ws, sine(rate, 0.25), rate, chunk_ms / 1000))
        assert abs(final["audio_ms"] - 250) <= 20, (rate, final)
        assert probe.max_rtt < 1.0, (rate, probe.max_rtt)

    one()
    grown = vm(fsrv.proc.pid)["VmHWM"] - rss0
    assert grown < 150 * MiB, f"peak RSS grew {grown / MiB:.0f} MiB"
    _settled(fsrv)


# ---------------------------------------------------------------------- crafted headers
FIELDS = [
    "model",
    "config_hash",
    "tensors",
    "tensors.0",
    "tensors.0.name",
    "tensors.0.dtype",
    "tensors.0.shape",
    "tensors.0.offset",
    "tensors.0.nbytes",
    "extra",
    "extra.kind",
    "extra.appended",
    "extra.messages_received",
    "extra.pending",
    "extra.last_logits",
    "extra.consumed",
    "extra.bytes_received",
    "extra.buffered",
    "extra.start",
    "extra.start.sample_rate",
    "extra.start.encoding",
    "extra.resampler",
    "extra.resampler.orig",
    "extra.resampler.new",
    "extra.resampler.buf",
    "extra.resampler.start",
    "extra.resampler.next",
    "extra.resampler.received",
    "extra.session_id",
    "extra.seq",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 999, 44100, 384001, 2**53, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["../escaped", "float32", "complex64", "speech", "text", "AAAA", "*"]),
)
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=8,
)


def test_fuzz_crafted_headers(fsrv):
    """Up to three header fields of a real blob set to arbitrary JSON values (NaN and
    Infinity included), re-signed: 201, 400, 409 or 429, never a 5xx, and nothing leaks."""
    _settled(fsrv)
    blobs = {k: arun(export_blob(fsrv, k)) for k in ("text", "speech")}
    _settled(fsrv)
    statuses: list[int] = []

    @fuzz(60)
    @given(
        kind=st.sampled_from(["text", "speech"]),
        edits=st.lists(st.tuples(st.sampled_from(FIELDS), values), min_size=1, max_size=3),
    )
    def one(kind: str, edits: list) -> None:
        def mutate(h: dict) -> None:
            for path, value in edits:  # (an edit whose parent an earlier edit replaced is skipped)
                with contextlib.suppress(
                    IndexError, KeyError, TypeError, ValueError, AttributeError
                ):
                    set_field(path, value)(h)

        r = httpx.post(fsrv.http + "/v1/sessions", content=craft(blobs[kind], mutate), timeout=30)
        statuses.append(r.status_code)
        assert r.status_code in (201, 400, 409, 429), (edits, r.status_code, r.text)
        json.loads(r.text)  # a JSON body either way

    one()
    assert 400 in statuses
    _settled(fsrv)


def test_fuzz_raw_headers(fsrv):
    """Arbitrary bytes or JSON text as the header: 400 invalid_state, never a 5xx."""
    _settled(fsrv)
    blob = arun(export_blob(fsrv, "text"))

    @fuzz(40)
    @given(
        raw=st.binary(max_size=64)
        | st.builds(lambda v: json.dumps(v).encode(), values)
        | st.builds(lambda n: b"[" * n + b"]" * n, st.integers(1, 200_000))
    )
    def one(raw: bytes) -> None:
        r = httpx.post(fsrv.http + "/v1/sessions", content=craft(blob, raw_header=raw), timeout=30)
        assert r.status_code in (400, 409), (raw[:80], r.status_code, r.text)

    one()
    _settled(fsrv)


def test_fuzz_f32_extremes_never_emit_nan(fsrv):
    """pcm_f32le frames of extreme or odd values: every message is strict JSON (no NaN)."""
    _settled(fsrv)
    specials = np.array([3e38, -3e38, 1e-45, 0.0, -0.0, 1e30, -1.0, 1.0], dtype="<f4")

    @fuzz(15)
    @given(idx=st.lists(st.integers(0, len(specials) - 1), min_size=1, max_size=64))
    def one(idx: list[int]) -> None:
        async def main() -> None:
            ws, ready = await start_speech(fsrv.ws, 16000, encoding="pcm_f32le")
            assert ready["type"] == "ready"
            await ws.send(np.repeat(specials[idx], 50).tobytes())
            with contextlib.suppress(websockets.ConnectionClosed):
                await send_json(ws, {"type": "end"})
            for text in await until_closed_or(ws, ("final", "error")):
                json.loads(text, parse_constant=_refuse)
            await ws.close()

        arun(main())

    one()
    _settled(fsrv)


def _refuse(name: str):
    raise AssertionError(f"the server sent {name}, which is not JSON")


# ---------------------------------------------------------------------- early closes
actions = st.lists(
    st.tuples(
        st.sampled_from(["speech", "text"]),
        st.sampled_from(["nothing", "start", "start+data", "start+wait"]),
        st.sampled_from(["close", "reset", "close-1001"]),
        st.floats(0, 0.03),
    ),
    min_size=1,
    max_size=12,
)


async def _early(url: str, kind: str, what: str, how: str, delay: float) -> None:
    ws = await websockets.connect(url + (SPEECH if kind == "speech" else TEXT), **WS_KW)
    if what != "nothing":
        start = {"type": "start"} | ({"sample_rate": 16000} if kind == "speech" else {})
        await send_json(ws, start)
        if what == "start+data":
            if kind == "speech":
                await ws.send(s16(sine(16000, 0.05)))
            else:
                await send_json(ws, {"type": "append", "text": "hi"})
        if what == "start+wait":
            await asyncio.sleep(delay)
    if how == "reset":
        ws.transport.abort()
    else:
        await ws.close(1001 if how == "close-1001" else 1000)


@pytest.mark.slow
def test_fuzz_early_closes(tmp_path, models_dir):
    """Clients that leave at any point around `start` (clean close, going-away close, TCP
    reset), many at once: afterwards nothing is left in use and a fresh client is served.
    (Its own server: a leak here must not fail the other fuzz tests.)"""
    with serve(tmp_path, models_dir, max_sessions=8, resume_grace_s=1, idle_timeout_s=10) as s:
        _early_closes(s)


def _early_closes(fsrv) -> None:
    _settled(fsrv)

    @fuzz(15)
    @given(batch=actions)
    def one(batch: list) -> None:
        async def main() -> None:
            await asyncio.gather(*[_early(fsrv.ws, *a) for a in batch], return_exceptions=True)

        arun(main())
        _settled(fsrv)
        ws_ready = arun(_fresh(fsrv.ws))
        assert ws_ready["type"] == "ready", ws_ready

    one()


async def _fresh(url: str) -> dict:
    ws, ready = await start_speech(url)
    await ws.close()
    return ready
