"""Two `dlr-serve` replicas sharing one real Redis behind a real HAProxy (deploy/haproxy.cfg):
speech streams and chat sessions spread over both; one replica SIGKILLed mid-stream; every
client resumes through HAProxy on the other (the clients' own auto-resume) with outputs equal
to an uninterrupted run; then a rolling restart of both replicas, one after the other, loses
no session: the chats and a 150 s speech stream that lives through the kill and both restarts
(its final equals an uninterrupted run)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from clients import AsyncChatSession, AsyncSpeechClient
from tests.server.replicas import HAPROXY_BIN, Replicas
from tests.server.store.conftest import redis_proc  # noqa: F401  (fixture)

SCORE_TOL = 1e-5  # complex64 state: float32 rounding differs with chunking and batching
GEN = {"max_new_tokens": 30, "temperature": 0.8, "seed": 5}
TURNS = ["Once upon a time", " and then", " so", " at last", " the end"]
CLIENT = {"resume_timeout": 90, "max_reconnects": 10}
LONG_S = 150.0  # a speech stream that outlives the kill and both rolling restarts


def tone(seconds: float, seed: int, parts: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    x = 0.3 * np.sin(2 * np.pi * (180 + 60 * seed) * t) + 0.05 * rng.standard_normal(t.size)
    return np.array_split(x.astype(np.float32), parts)


async def speech_ref(url: str, chunks) -> list:
    async with AsyncSpeechClient(url) as c:
        return [r async for r in c.stream(chunks, sample_rate=16000)]


async def chat_ref(url: str, i: int) -> list[str]:
    async with AsyncChatSession(url) as chat:
        return [(await chat.say(f"{t} {i}", **GEN)).text for t in TURNS]


@pytest.mark.slow  # five dlr-serve starts, Redis, HAProxy, 2.5 minutes of traffic
def test_failover_and_rolling_restart_through_haproxy(models_dir, tmp_path, redis_proc):  # noqa: F811
    if HAPROXY_BIN is None:
        pytest.skip("haproxy is not installed (scripts/setup.sh installs it)")
    clips = [tone(6.0, s) for s in range(2)]
    long_clip = tone(LONG_S, 7, parts=int(LONG_S * 5))  # lasts through the rolling restart
    with Replicas(models_dir, tmp_path, redis_proc.url, checkpoint_audio_s=0.5) as rs:

        async def references():
            sp = [await speech_ref(rs.url(0), c) for c in clips]
            ch = [await chat_ref(rs.url(0), i) for i in range(2)]
            return sp, ch, await speech_ref(rs.url(0), long_clip)

        ref_speech, ref_chat, ref_long = asyncio.run(references())
        spread: list[int] = []

        async def traffic():
            heard = [asyncio.Event() for _ in clips]
            started = [asyncio.Event() for _ in range(2)]
            killed = asyncio.Event()
            rolled = [asyncio.Event() for _ in range(2)]
            turn_done = [[asyncio.Event() for _ in range(2)] for _ in TURNS]
            rolled_back = asyncio.Event()  # both replicas restarted

            async def speech(k: int):
                async with AsyncSpeechClient(rs.lb, **CLIENT) as c:
                    out = []
                    async for r in c.stream(clips[k], sample_rate=16000, realtime=True):
                        out.append(r)
                        if r.audio_ms >= 1500:
                            heard[k].set()
                    return out, c.reconnects

            async def long_speech():
                async with AsyncSpeechClient(rs.lb, **CLIENT) as c:
                    out = [r async for r in c.stream(long_clip, sample_rate=16000, realtime=True)]
                    return out, c.reconnects, rolled_back.is_set()

            async def chat(i: int):
                async with AsyncChatSession(rs.lb, **CLIENT) as ch:
                    texts = [(await ch.say(f"{TURNS[0]} {i}", **GEN)).text]
                    started[i].set()
                    await killed.wait()
                    texts.append((await ch.say(f"{TURNS[1]} {i}", **GEN)).text)
                    turn_done[1][i].set()
                    for j in (2, 3):  # each after one replica's rolling restart
                        await rolled[j - 2].wait()
                        texts.append((await ch.say(f"{TURNS[j]} {i}", **GEN)).text)
                        turn_done[j][i].set()
                    texts.append((await ch.say(f"{TURNS[4]} {i}", **GEN)).text)
                    return texts, ch.reconnects

            async def operator():
                for e in (*heard, *started):
                    await e.wait()
                spread.extend([await asyncio.to_thread(rs.sessions, i) for i in (0, 1)])
                rs.kill(0)  # mid-stream: both speech streams are half-way
                killed.set()
                await asyncio.to_thread(rs.restart, 0)
                await asyncio.to_thread(rs.wait_up, 0)
                for i in range(2):
                    await turn_done[1][i].wait()
                for j, victim in enumerate((1, 0)):  # rolling restart: r2, then r1
                    await asyncio.to_thread(rs.terminate, victim)
                    rolled[j].set()
                    for i in range(2):
                        await turn_done[j + 2][i].wait()
                    await asyncio.to_thread(rs.restart, victim)
                    await asyncio.to_thread(rs.wait_up, victim)
                rolled_back.set()

            res = await asyncio.gather(
                *(speech(k) for k in range(2)), chat(0), chat(1), operator(), long_speech()
            )
            return res[:2], res[2:4], res[5]

        speech_out, chat_out, long_out = asyncio.run(traffic())
        logs = rs.log(0) + rs.log(1)
    assert min(spread) >= 1, spread  # both replicas had live sessions when r1 was killed
    for (out, _), ref in zip(speech_out, ref_speech, strict=True):
        final = out[-1]
        assert final.is_final and final.label == ref[-1].label
        assert final.score == pytest.approx(ref[-1].score, abs=SCORE_TOL)
        assert final.audio_ms == pytest.approx(ref[-1].audio_ms, abs=1.0)
        ms = [r.audio_ms for r in out]
        assert ms == sorted(ms)
    for (texts, reconnects), ref in zip(chat_out, ref_chat, strict=True):
        assert texts == ref
        assert reconnects >= 2  # both rolling restarts moved it (and the kill, if it was on r1)
    assert "recovered session" in logs
    out, reconnects, rolled_first = long_out  # the stream through the kill and the rolling restart
    assert rolled_first and reconnects >= 2
    assert out[-1].is_final and out[-1].label == ref_long[-1].label
    assert out[-1].score == pytest.approx(ref_long[-1].score, abs=SCORE_TOL)
    assert out[-1].audio_ms == pytest.approx(ref_long[-1].audio_ms, abs=1.0)
