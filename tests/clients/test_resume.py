"""Dropped connections are resumed transparently, against a real server.

The fault is injected on the client's side: its TCP connection is aborted (no close frame, as
when a network path dies); the server keeps the session for its grace period and the client
reconnects with the session id and resume token. Outputs must equal an uninterrupted run.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from clients import AsyncChatSession, AsyncSpeechClient
from clients.audio import read_audio

# complex64 state: scores of the same audio differ in float32 rounding with how it is chunked
# and batched (well below what a lost or repeated 10 ms of audio changes)
SCORE_TOL = 1e-5


def drop(client) -> None:
    """Kill the client's connection abruptly (TCP abort, no WebSocket close)."""
    client._conn._ws.transport.abort()


@pytest.mark.slow  # 6 s: waits out a reconnect
def test_speech_stream_survives_a_dropped_connection(live_server, word_wav):
    clip = read_audio(word_wav)
    audio = np.tile(clip.samples, 3)  # 3 s
    chunks = np.array_split(audio, 60)  # 50 ms each

    dropped: list[float] = []

    async def go(with_drop: bool):
        async with AsyncSpeechClient(live_server.url) as c:
            out = []
            async for r in c.stream(chunks, sample_rate=clip.sample_rate, realtime=True):
                out.append(r)
                if with_drop and not dropped and r.audio_ms >= 800:
                    dropped.append(r.audio_ms)
                    drop(c)
            return out, c.reconnects, c.resume_token

    ref, _, token = asyncio.run(go(False))
    if token is None:
        pytest.skip("this server hands out no resume token")
    got, reconnects, _ = asyncio.run(go(True))
    assert reconnects == 1
    assert got[-1].is_final and got[-1].label == ref[-1].label
    assert got[-1].score == pytest.approx(ref[-1].score, abs=SCORE_TOL)
    assert got[-1].audio_ms == pytest.approx(ref[-1].audio_ms, abs=1.0)
    ms = [r.audio_ms for r in got]
    assert ms == sorted(ms)  # no partial delivered twice or out of order


def test_chat_survives_drops_between_turns_and_mid_generation(live_server):
    async def go(with_drop: bool):
        async with AsyncChatSession(live_server.url) as chat:
            first = await chat.say("Hello", max_new_tokens=6, temperature=0)
            if with_drop:
                drop(chat)  # between turns
            await chat.append(" world")
            pieces = []
            async for ev in chat.generate(max_new_tokens=30, temperature=0):
                pieces.append(ev)
                if with_drop and len(pieces) == 3:
                    drop(chat)  # in the middle of a generation
            return first.text, pieces, chat.reconnects, chat.resume_token

    ref_first, ref_pieces, _, token = asyncio.run(go(False))
    if token is None:
        pytest.skip("this server hands out no resume token")
    first, pieces, reconnects, _ = asyncio.run(go(True))
    assert reconnects == 2
    assert first == ref_first
    assert "".join(p.text for p in pieces) == "".join(p.text for p in ref_pieces)
    assert pieces[-1].usage == ref_pieces[-1].usage


def test_chat_resumes_across_a_server_restart(server_factory, models_dir, tmp_path):
    """SIGTERM: the server drains, tells the client it is going away (resumable), persists the
    session; a new server on the same port restores it and the client carries on by itself."""
    state = tmp_path / "sessions"
    first = server_factory(models_dir, state_dir=str(state))
    port = int(first.url.rsplit(":", 1)[1])

    async def reference() -> list[str]:
        async with AsyncChatSession(first.url) as chat:
            return [
                (await chat.say(t, max_new_tokens=8, temperature=0)).text for t in ("One", " two")
            ]

    expected = asyncio.run(reference())

    async def across_restart() -> tuple[list[str], int]:
        async with AsyncChatSession(first.url, resume_timeout=90) as chat:
            a = (await chat.say("One", max_new_tokens=8, temperature=0)).text
            await asyncio.to_thread(first.stop, 30)  # graceful stop: drain + persist
            await asyncio.to_thread(server_factory, models_dir, port, state_dir=str(state))
            b = (await chat.say(" two", max_new_tokens=8, temperature=0)).text
            return [a, b], chat.reconnects

    texts, reconnects = asyncio.run(across_restart())
    assert texts == expected
    assert reconnects == 1
