"""The speech client (async and sync) against a real server: results, pacing, errors."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from clients import (
    AsyncSpeechClient,
    ConnectionFailed,
    ServerError,
    SpeechClient,
    SpeechResult,
    Timeout,
)
from clients.audio import read_audio
from dlr_runtime import load_recurrent

# complex64 state: scores of the same audio differ in float32 rounding with how it is chunked
# and batched (well below what a lost or repeated 10 ms of audio changes)
SCORE_TOL = 1e-5

LABELS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]


def reference_scores(models_dir: Path, wav: Path) -> np.ndarray:
    """Class probabilities the tiny speech model gives the clip, computed without the server."""
    rec = load_recurrent(models_dir / "tiny-speech", dtype=torch.complex128)
    pcm, rate = sf.read(wav, dtype="int16")
    assert rate == rec.config.sample_rate
    x = torch.from_numpy(pcm.astype(np.float32) / 32768.0)[None]  # (1, T)
    _, state = rec.chunk(x, rec.init_state(1))
    return torch.softmax(rec.scores(state)[0].double(), -1).numpy()  # (C,)


def run(coro):
    return asyncio.run(coro)


async def collect(client: AsyncSpeechClient, wav: Path, **kw) -> list[SpeechResult]:
    return [r async for r in client.stream_file(wav, **kw)]


def test_final_matches_the_model_run_without_the_server(live_server, models_dir, word_wav):
    async def go():
        async with AsyncSpeechClient(live_server.url) as c:
            return await collect(c, word_wav, chunk_ms=50)

    results = run(go())
    final = results[-1]
    assert final.is_final and all(not r.is_final for r in results[:-1])
    ref = reference_scores(models_dir, word_wav)
    assert final.label == LABELS[int(ref.argmax())]
    assert final.score == pytest.approx(float(ref.max()), abs=1e-4)
    assert [t.label for t in final.top] == [LABELS[i] for i in np.argsort(-ref)[: len(final.top)]]
    assert final.audio_ms == pytest.approx(1000.0, abs=1.0)
    assert final.session_id


def test_realtime_pacing_sends_partials_as_audio_goes_out(live_server, word_wav):
    async def go(realtime: bool):
        async with AsyncSpeechClient(live_server.url) as c:
            t0 = time.monotonic()
            out = await collect(c, word_wav, chunk_ms=100, realtime=realtime)
            return out, time.monotonic() - t0

    paced, paced_s = run(go(True))
    fast, fast_s = run(go(False))
    assert paced_s >= 0.9  # one second of audio takes about a second to send
    assert fast_s < paced_s
    partial_ms = [r.audio_ms for r in paced if not r.is_final]
    assert len(partial_ms) >= 3, partial_ms  # results arrived while audio was still going out
    assert partial_ms == sorted(partial_ms) and partial_ms[-1] <= 1000.0
    assert paced[-1].label == fast[-1].label
    assert paced[-1].score == pytest.approx(fast[-1].score, abs=SCORE_TOL)


def test_sessions_in_a_row_on_one_connection_and_encodings(live_server, word_wav):
    clip = read_audio(word_wav)

    async def go():
        async with AsyncSpeechClient(live_server.url, model="tiny-speech") as c:
            a = await c.recognize_file(word_wav)
            sid_a = c.session_id
            b = await c.recognize_file(word_wav, encoding="pcm_f32le")
            chunks = np.array_split(clip.samples, 7)  # numpy float chunks of uneven length
            c_res = [r async for r in c.stream(chunks, sample_rate=clip.sample_rate)]
            return a, sid_a, b, c_res[-1], c.session_id

    a, sid_a, b, c_final, sid_c = run(go())
    assert a.label == b.label == c_final.label
    assert b.score == pytest.approx(a.score, abs=1e-3)  # f32 vs s16 quantisation
    assert c_final.score == pytest.approx(a.score, abs=SCORE_TOL)
    assert sid_a != sid_c  # each stream is its own session


def test_sync_client_matches_async(live_server, word_wav):
    async def go():
        async with AsyncSpeechClient(live_server.url) as c:
            return await c.recognize_file(word_wav)

    ref = run(go())
    with SpeechClient(live_server.url) as c:
        results = list(c.stream_file(word_wav, chunk_ms=40))
        again = c.recognize_file(word_wav)
        assert c.labels == LABELS
    assert results[-1].is_final
    assert results[-1].label == again.label == ref.label
    assert again.score == pytest.approx(ref.score, abs=SCORE_TOL)


def test_server_errors_carry_code_and_close_code(live_server, word_wav):
    async def bad_model():
        async with AsyncSpeechClient(live_server.url, model="no-such-model") as c:
            await c.recognize_file(word_wav)

    with pytest.raises(ServerError) as e:
        run(bad_model())
    assert e.value.code == "unknown_model" and "no-such-model" in e.value.message
    assert e.value.close_code is not None and e.value.close_code >= 1000

    async def bad_rate():
        async with AsyncSpeechClient(live_server.url) as c:
            async for _ in c.stream([b"\x00\x00" * 100], sample_rate=10):
                pass

    with pytest.raises(ServerError) as e:
        run(bad_rate())
    assert "sample_rate" in e.value.message

    with pytest.raises(ValueError, match="encoding"):
        run(collect(AsyncSpeechClient(live_server.url), word_wav, encoding="mp3"))
    with pytest.raises(ValueError, match="no such file"):
        run(collect(AsyncSpeechClient(live_server.url), word_wav.with_name("missing.wav")))


def test_connection_refused_and_silent_server():
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with pytest.raises(ConnectionFailed):
        run(AsyncSpeechClient(f"http://127.0.0.1:{dead}", connect_timeout=2).connect())

    # a server that accepts TCP connections and never answers: the handshake times out
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    t = threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True)
    t.start()
    try:
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(Timeout):
            run(AsyncSpeechClient(f"http://127.0.0.1:{port}", connect_timeout=0.5).connect())
        assert time.monotonic() - t0 < 5
    finally:
        for c in held:
            c.close()
        listener.close()


def test_server_going_away_mid_stream_is_reported_not_hung(server_factory, models_dir, word_wav):
    """A server stopped mid-stream: the client raises ConnectionFailed promptly (no resume
    token was given, so there is nothing to resume)."""
    server = server_factory(models_dir)
    clip = read_audio(word_wav)
    long_audio = np.tile(clip.samples, 20)  # 20 s, sent at real time
    stopped_at: list[float] = []

    async def go() -> None:
        async with AsyncSpeechClient(server.url, read_timeout=20, max_reconnects=1) as c:
            chunks = np.array_split(long_audio, 200)
            async for r in c.stream(chunks, sample_rate=clip.sample_rate, realtime=True):
                if r.audio_ms >= 300 and not stopped_at:
                    server.terminate()  # graceful shutdown while the stream is live
                    stopped_at.append(time.monotonic())

    with pytest.raises(ConnectionFailed):
        run(go())
    assert stopped_at and time.monotonic() - stopped_at[0] < 10
