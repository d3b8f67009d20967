"""Speech streams are parked too (server/sessions/speech.py, `SpeechSession.park`): a stream
idle past `park_after_idle_s` (connected or not), or one whose client is gone while the
model's slots are all taken, is sealed into the parked tier (state, resampler, partial frame,
outbox) and its slot freed; its next frame, `end`, resume or export brings it back, and its
final equals an uninterrupted run of the same audio."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import websockets

from tests.conftest import SPEECH_NAME
from tests.server.conftest import LiveServer, make_settings
from tests.server.test_resume import clip, detached, slots_in_use
from tests.server.waits import eventually, eventually_sync
from tests.server.wshelp import (
    SPEECH,
    drop,
    recv_json,
    resume,
    send_json,
    speech_solo,
    speech_start,
    until_final,
)

SCORE_TOL = 1e-5  # complex64 state: float32 rounding differs with chunking and batching
CHUNK = 3200  # 100 ms of pcm_s16le at 16 kHz


def same_final(got: dict, ref: dict) -> None:
    assert got["type"] == ref["type"] == "final"
    assert got["label"] == ref["label"]
    assert got["score"] == pytest.approx(ref["score"], abs=SCORE_TOL)
    assert got["audio_ms"] == pytest.approx(ref["audio_ms"], abs=1.0)


async def send(ws, data: bytes, lo: int, hi: int) -> None:
    for i in range(lo, hi, CHUNK):
        await ws.send(data[i : min(i + CHUNK, hi)])


def parked_count(srv: LiveServer, reason: str) -> float:
    ev = srv.app.state.dlr.metrics.evictions
    return ev.labels(SPEECH_NAME, reason)._value.get()


def test_idle_connected_stream_is_parked_then_continues_on_its_next_frame(models_dir):
    data, cut = clip(3), 7 * CHUNK + 1000  # (a partial frame waits while it is parked)
    with LiveServer(make_settings(models_dir, park_after_idle_s=0.3)) as srv:

        async def main():
            solo = await speech_solo(srv.ws, data, CHUNK)
            ws, ready = await speech_start(srv.ws, interim_results=False)
            await send(ws, data, 0, cut)
            sess = srv.app.state.sessions.live[ready["session_id"]]
            await eventually(lambda: sess.parked, timeout=10)
            await eventually(lambda: slots_in_use(srv, SPEECH_NAME) == 0, timeout=10)
            in_use = slots_in_use(srv, SPEECH_NAME)
            async with httpx.AsyncClient(timeout=10) as h:  # a parked stream exports too
                url = f"{srv.http}/v1/sessions/{ready['session_id']}/state"
                r = await h.get(url, headers={"X-Resume-Token": ready["resume_token"]})
            await send(ws, data, cut, len(data))  # the next frame restores it
            await send_json(ws, {"type": "end"})
            final = await until_final(ws, [])
            await ws.close()
            return solo, final, in_use, r

        solo, final, in_use, r = asyncio.run(main())
        idle = parked_count(srv, "parked_idle")
    assert in_use == 0 and idle >= 1
    assert r.status_code == 200 and r.content.startswith(b"DLRSIG"), r.text
    same_final(final, solo)


def test_dropped_stream_is_pushed_out_for_a_new_one_then_resumes(models_dir):
    """One speech slot: a stream whose client dropped (waiting for its resume) is parked for
    a new stream instead of the new one being refused; its resume continues it."""
    data, cut = clip(4), 8 * CHUNK
    settings = make_settings(models_dir, max_sessions=1, park_after_idle_s=0)
    with LiveServer(settings) as srv:

        async def main():
            ws, ready = await speech_start(srv.ws, interim_results=False)
            await send(ws, data, 0, cut)
            sess = srv.app.state.sessions.live[ready["session_id"]]
            await eventually(lambda: sess.consumed * 2 == cut, timeout=10)
            drop(ws)
            await eventually(lambda: detached(srv, ready["session_id"]), timeout=10)
            solo = await speech_solo(srv.ws, data, CHUNK)  # needs the only slot
            was_parked = sess.parked
            ws, again = await resume(srv.ws, SPEECH, ready)
            await send(ws, data, again["bytes_received"], len(data))
            await send_json(ws, {"type": "end"})
            final = await until_final(ws, [])
            await ws.close()
            return solo, final, was_parked, again

        solo, final, was_parked, again = asyncio.run(main())
        pushed = parked_count(srv, "parked_for_room")
        eventually_sync(lambda: slots_in_use(srv, SPEECH_NAME) == 0, timeout=10)
        in_use = slots_in_use(srv, SPEECH_NAME)
    assert was_parked and pushed >= 1
    assert again["bytes_received"] == cut
    same_final(final, solo)
    assert in_use == 0


def test_a_connected_stream_that_sent_audio_recently_is_not_pushed_out(models_dir):
    """Without idle parking, a live connected stream keeps its slot: a new one is refused."""
    settings = make_settings(models_dir, max_sessions=1, park_after_idle_s=0)
    with LiveServer(settings) as srv:

        async def main():
            ws, _ = await speech_start(srv.ws, interim_results=False)
            await ws.send(clip(1)[:CHUNK])
            ws2 = await websockets.connect(srv.ws + SPEECH)
            refused = await recv_json(ws2)  # (refused at once: every speech slot is taken)
            await ws2.close()
            await ws.close()
            return refused

        refused = asyncio.run(main())
    assert refused["type"] == "error" and refused["code"] == "overloaded"
