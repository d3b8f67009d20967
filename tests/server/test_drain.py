"""Graceful drain and restore: readiness off and new sessions refused while draining; a real
`dlr-serve` subprocess killed with SIGTERM mid-stream persists every live session, a restarted
one restores them (skipping a corrupted file with a logged error), and the clients resume with
outputs equal to uninterrupted runs."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import pytest
import websockets

from tests.conftest import LM_NAME
from tests.server.conftest import LiveServer, make_settings, process_server
from tests.server.faults import install
from tests.server.waits import eventually
from tests.server.wshelp import (
    SPEECH,
    TEXT,
    recv_json,
    resume,
    s16,
    send_json,
    speech_solo,
    speech_start,
    text_collect,
    text_start,
    text_turn,
    until_final,
)

CHUNK = 3200


def clip(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    t = np.arange(24000) / 16000
    return s16(
        (
            0.3 * np.sin(2 * np.pi * (150 + 70 * seed) * t) + 0.05 * rng.standard_normal(t.size)
        ).astype(np.float32)
    )


def test_draining_refuses_new_work_and_finishes_in_flight(models_dir, tmp_path):
    srv = LiveServer(make_settings(models_dir, state_dir=tmp_path / "state", drain_timeout_s=20))
    srv.__enter__()
    st = srv.app.state.dlr
    faults = install(st.models[LM_NAME].scheduler)

    async def main():
        ws, hello = await text_start(srv.ws)
        live = srv.app.state.sessions.live
        sess = live[hello["session_id"]]
        await send_json(ws, {"type": "append", "text": "abc"})
        await eventually(lambda: sess.messages_received >= 1 and not sess.in_turn())
        faults.pause()  # the generation cannot finish yet
        await send_json(ws, {"type": "generate", "max_new_tokens": 5, "temperature": 0})
        await eventually(lambda: sess.messages_received >= 2)  # (taken: its batch is held)
        stopper = threading.Thread(target=lambda: setattr(srv.server, "should_exit", True))
        stopper.start()
        async with httpx.AsyncClient(timeout=5) as h:
            await eventually(lambda: not st.ready, timeout=5)
            ready = await h.get(srv.http + "/readyz")
            gen = await h.post(srv.http + "/v1/generate", json={"prompt": "x", "max_new_tokens": 2})
        ws2 = await websockets.connect(srv.ws + TEXT)
        refused = await recv_json(ws2)
        faults.resume()  # in-flight work completes, then the client is told
        text, done = await text_collect(ws)
        bye = await recv_json(ws)
        await ws.wait_closed()
        return ready, gen, refused, done, bye, ws.close_code, ws.close_reason

    try:
        ready, gen, refused, done, bye, code, reason = asyncio.run(main())
    finally:
        srv.__exit__()
    assert ready.status_code == 503 and ready.json()["ready"] is False
    assert gen.status_code == 503 and gen.headers["Retry-After"]
    assert refused["code"] == "overloaded" and "shutting down" in refused["message"]
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 5
    assert bye["type"] == "going_away" and bye["resume"] is True
    assert code == 1001 and "resume" in reason
    assert len(list((tmp_path / "state").glob("*.state"))) == 1


def test_messages_after_the_quiesce_are_held_and_not_taken(models_dir, tmp_path):
    """A message that arrives once the drain has stopped taking work is not handled: the state
    written and the resume position (`messages_received`) are those before it, and its client
    is still told `going_away` with `resume: true` (it re-sends after resuming)."""
    srv = LiveServer(make_settings(models_dir, state_dir=tmp_path / "state", drain_timeout_s=1))
    srv.__enter__()
    st = srv.app.state.dlr
    faults = install(st.models[LM_NAME].scheduler)

    async def main():
        live = srv.app.state.sessions.live
        a, hello_a = await text_start(srv.ws)
        await send_json(a, {"type": "append", "text": "abc"})
        sa = live[hello_a["session_id"]]
        await eventually(lambda: sa.messages_received == 1 and not sa.in_turn())
        b, hello_b = await text_start(srv.ws)
        sb = live[hello_b["session_id"]]
        faults.pause()  # b's prefill is held: the drain cannot settle and times out
        await send_json(b, {"type": "append", "text": "xyz"})
        await eventually(lambda: sb.in_turn())
        threading.Thread(target=lambda: setattr(srv.server, "should_exit", True)).start()
        await eventually(lambda: st.quiesced, timeout=10)
        await send_json(a, {"type": "append", "text": " more"})  # after the quiesce
        await send_json(b, {"type": "generate", "max_new_tokens": 3})
        await asyncio.sleep(0.3)
        faults.resume()  # b's prefill (taken before the quiesce) completes
        byes = [await recv_json(a), await recv_json(b)]
        await a.wait_closed()
        await b.wait_closed()
        return sa, sb, byes, (a.close_code, b.close_code)

    try:
        sa, sb, byes, codes = asyncio.run(main())
    finally:
        srv.__exit__()
    assert [m["type"] for m in byes] == ["going_away"] * 2 and all(m["resume"] for m in byes)
    assert codes == (1001, 1001)
    assert sa.messages_received == 1 and sb.messages_received == 1  # the late ones not taken
    assert sb.g is None and sb.text.inflight is None
    assert len(list((tmp_path / "state").glob("*.state"))) == 2


@pytest.mark.slow  # a dlr-serve subprocess (or two) and tens of seconds of load
def test_sigterm_mid_stream_then_restart_resumes_all(models_dir, tmp_path):
    state = tmp_path / "state"
    clips = [clip(i) for i in range(3)]
    gen = {"max_new_tokens": 60, "temperature": 0.9, "seed": 11}
    turns = ["Hi there", " go on", " third"]
    a = process_server(models_dir, tmp_path / "a.log", state_dir=state, resume_grace_s=60)
    with a:

        async def first_half():
            refs = [await speech_solo(a.ws, c, CHUNK) for c in clips]
            ws, _ = await text_start(a.ws)
            ref_text = [(await text_turn(ws, t, gen))[0] for t in turns]
            await ws.close()
            speech = []
            for c in clips:
                ws, ready = await speech_start(a.ws)
                for i in range(0, len(c) // 2, CHUNK):
                    await ws.send(c[i : i + CHUNK])
                speech.append((ws, ready, [await recv_json(ws)]))
            texts = []
            for _ in range(2):
                ws, ready = await text_start(a.ws)
                t1, _ = await text_turn(ws, turns[0], gen)
                assert t1 == ref_text[0]
                await send_json(ws, {"type": "append", "text": turns[1]})
                await send_json(ws, {"type": "generate", **gen})
                texts.append((ws, ready, [await recv_json(ws)]))  # mid-generation
            a.proc.send_signal(15)  # SIGTERM while streams and generations are live
            closes = []
            for ws, _, seen in speech + texts:
                while True:
                    try:
                        m = await recv_json(ws)
                    except websockets.ConnectionClosed:
                        break
                    seen.append(m)
                closes.append((ws.close_code, seen[-1]))
            return refs, ref_text, speech, texts, closes

        refs, ref_text, speech, texts, closes = asyncio.run(first_half())
        assert a.proc.wait(60) in (0, -15)  # uvicorn re-raises the SIGTERM it handled
        assert "drain: 5 session(s) persisted" in a.log()
    for code, last in closes:
        assert code == 1001 and last["type"] == "going_away" and last["resume"] is True
    files = sorted(state.glob("*.state"))
    assert len(files) == 5
    (state / ("0" * 32 + ".state")).write_bytes(files[0].read_bytes()[:-10] + b"corrupted!")
    b = process_server(models_dir, tmp_path / "b.log", state_dir=state, resume_grace_s=60)
    with b:

        async def second_half():
            finals = []
            for (_, ready, seen), c in zip(speech, clips, strict=True):
                last = max(m.get("seq", 0) for m in seen)
                ws, again = await resume(b.ws, SPEECH, ready, last_seq=last)
                for i in range(again["bytes_received"], len(c), CHUNK):
                    await ws.send(c[i : i + CHUNK])
                await send_json(ws, {"type": "end"})
                finals.append(await until_final(ws, []))
                await ws.close()
            convs = []
            for _, ready, seen in texts:
                last = max(m.get("seq", 0) for m in seen)
                ws, again = await resume(b.ws, TEXT, ready, last_seq=last)
                assert again["messages_received"] == 4 and again["generating"] is False
                assert any(m["type"] == "done" for m in seen)  # the drain finished the turn
                t3, _ = await text_turn(ws, turns[2], gen)
                await ws.close()
                convs.append((seen, t3))
            return finals, convs

        finals, convs = asyncio.run(second_half())
        log = b.log()
    for f, r in zip(finals, refs, strict=True):
        assert f["label"] == r["label"] and f["audio_ms"] == r["audio_ms"]
        assert f["score"] == pytest.approx(r["score"], abs=2e-6)
    for seen, t3 in convs:
        done_at = [i for i, m in enumerate(seen) if m["type"] == "done"]
        second = "".join(m["text"] for m in seen[: done_at[-1]] if m["type"] == "token")
        assert second == ref_text[1]  # the generation in flight at SIGTERM completed
        assert t3 == ref_text[2]
    assert "skipping " + "0" * 32 + ".state" in log
    assert (state / ("0" * 32 + ".state.bad")).exists()
    assert not list(state.glob("*.state"))
