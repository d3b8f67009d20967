"""Fuzzing: random JSON and binary frames on both WebSocket protocols (hypothesis) and the HTTP
API against the server's own OpenAPI schema (schemathesis). No 5xx, no crash, no hang, every
refusal a clear error, and well-behaved sessions running at the same time get exactly the
outputs they get alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading

import httpx
import numpy as np
import pytest
import schemathesis
import websockets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from tests.server.conftest import LiveServer, make_settings
from tests.server.wshelp import SPEECH, TEXT, recv_json, s16, speech_solo, text_start, text_turn

pytestmark = pytest.mark.slow  # fuzzing: tens of seconds of generated input

FRAME_LIMIT = 4096
CODES = {
    "invalid_json",
    "invalid_message",
    "invalid_audio",
    "no_session",
    "unknown_model",
    "frame_too_big",
    "invalid_resume",
}
CLOSES = {1000, 1003, 1008, 1009}
TYPES = ["start", "end", "append", "generate", "resume", "ready", "bogus", ""]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 8000, 16000, 44100, 384000, 10**9, -1, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["pcm_s16le", "pcm_f32le", "mp3", "tiny-lm", "tiny-speech", "../x"]),
)
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=6,
)
fields = st.sampled_from(
    [
        "sample_rate",
        "encoding",
        "model",
        "interim_results",
        "text",
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "stop",
        "session_id",
        "resume_token",
        "last_seq",
    ]
)
messages = st.fixed_dictionaries({"type": st.one_of(st.sampled_from(TYPES), values)}).flatmap(
    lambda base: st.dictionaries(fields, values, max_size=4).map(lambda d: {**base, **d})
)
text_frames = st.one_of(
    messages.map(lambda m: json.dumps(m, allow_nan=True)),
    st.text(max_size=40),
    st.sampled_from(["", "[" * 5000, '{"type": "start"', "null", "[]", "NaN", '"start"']),
)
binary_frames = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [b"", b"\x00", np.array([np.nan, np.inf], "<f4").tobytes(), b"\x00" * (FRAME_LIMIT + 2)]
    ),
    st.integers(1, 400).map(lambda n: np.zeros(n, "<i2").tobytes()),
)
valid_starts = st.sampled_from(
    [
        {"type": "start", "sample_rate": 16000},
        {"type": "start", "sample_rate": 8000, "encoding": "pcm_f32le"},
        {"type": "start", "sample_rate": 1000},
        {"type": "start"},
        {"type": "append", "text": "hi"},
        {"type": "generate", "max_new_tokens": 2},
        {"type": "end"},
    ]
).map(json.dumps)
frames = st.lists(st.one_of(text_frames, binary_frames, valid_starts), min_size=1, max_size=6)


class Background:
    """Well-behaved speech and text sessions running (in their own thread) during the fuzzing."""

    def __init__(self, srv: LiveServer, audio: bytes) -> None:
        self.srv, self.audio = srv, audio
        self.stop = threading.Event()
        self.results: list = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            self.error = e

    async def _main(self) -> None:
        while not self.stop.is_set():
            final = await speech_paced(self.srv.ws, self.audio)
            ws, _ = await text_start(self.srv.ws)
            turns = [(await text_turn(ws, t, GEN))[0] for t in TURNS]
            await ws.close()
            self.results.append((final, turns))


GEN = {"max_new_tokens": 8, "temperature": 0.8, "seed": 5}
TURNS = ["first", " second"]


async def speech_paced(url: str, data: bytes) -> dict:
    async with websockets.connect(url + SPEECH) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "interim_results": False}))
        await recv_json(ws)
        for i in range(0, len(data), 1600):
            await ws.send(data[i : i + 1600])
            await asyncio.sleep(0.01)
        await ws.send(json.dumps({"type": "end"}))
        while True:
            m = await recv_json(ws)
            if m["type"] == "final":
                return m


@pytest.fixture(scope="module")
def fuzz_server(models_dir):
    with LiveServer(
        make_settings(models_dir, max_frame_bytes=FRAME_LIMIT, resume_grace_s=1.0)
    ) as srv:
        yield srv


async def play(url: str, path: str, frames: list) -> list[tuple]:
    """Send the frames; read everything until the server closes or 1 s passes idle."""
    got: list[tuple] = []
    async with websockets.connect(url + path, max_size=None, close_timeout=2) as ws:
        for f in frames:
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(f)
        try:
            while True:
                got.append(("msg", json.loads(await asyncio.wait_for(ws.recv(), 1.0))))
        except TimeoutError:
            got.append(("open", None))
        except websockets.ConnectionClosed:
            got.append(("closed", ws.close_code))
    return got


def check(got: list[tuple]) -> None:
    for kind, v in got:
        if kind == "msg":
            assert v["type"] in ("ready", "partial", "final", "token", "done", "error"), v
            if v["type"] == "error":
                assert v["code"] in CODES and v["message"], v
        elif kind == "closed":
            assert v in CLOSES, got


def test_websocket_fuzz(fuzz_server):
    srv = fuzz_server
    rng = np.random.default_rng(0)
    audio = s16((0.3 * rng.standard_normal(16000)).astype(np.float32))

    async def solo():
        final = await speech_paced(srv.ws, audio)
        ws, _ = await text_start(srv.ws)
        turns = [(await text_turn(ws, t, GEN))[0] for t in TURNS]
        await ws.close()
        return final, turns

    expected = asyncio.run(solo())
    bg = Background(srv, audio)
    bg.thread.start()

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frames=frames, path=st.sampled_from([SPEECH, TEXT]))
    def fuzz(frames, path):
        check(asyncio.run(play(srv.ws, path, frames)))

    try:
        fuzz()
    finally:
        bg.stop.set()
        bg.thread.join(60)
    assert bg.error is None, bg.error
    assert len(bg.results) >= 1
    for final, turns in bg.results:
        assert turns == expected[1]
        assert (
            final["label"] == expected[0]["label"] and final["audio_ms"] == expected[0]["audio_ms"]
        )
        assert math.isclose(final["score"], expected[0]["score"], abs_tol=2e-6)
    assert httpx.get(srv.http + "/healthz").status_code == 200
    assert asyncio.run(speech_solo(srv.ws, audio, 3200))["label"] == expected[0]["label"]


# ---------------------------------------------------------------- HTTP (schemathesis)
def test_http_api_schemathesis(fuzz_server):
    """Every operation of the server's OpenAPI schema, 30 generated requests each (bodies,
    headers, path and query parameters): no 5xx; JSON errors carry `error` or `detail`."""
    srv = fuzz_server
    schema = schemathesis.openapi.from_url(srv.http + "/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    # health, ready, metrics, models, generate, chat, completions, responses (create, get,
    # delete), prefixes, sessions (state, import, fork)
    assert len(ops) == 14

    for op in ops:

        @settings(
            max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(case=op.as_strategy())
        def run(case):
            response = case.call_and_validate(
                base_url=srv.http, checks=[not_a_server_error], timeout=30
            )
            ctype = response.headers.get("content-type", [""])
            ctype = ctype[0] if isinstance(ctype, list) else ctype
            if response.status_code >= 400 and ctype.startswith("application/json"):
                body = response.json()
                assert "error" in body or "detail" in body, body

        run()
