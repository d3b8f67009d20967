"""Session and slot ownership: nothing a client does can leak a session or a state slot.

- start-then-close before `ready` arrives (clean close and TCP reset, both endpoints): every
  session is finished or detached and reclaimed by the resume grace;
- an imported state whose session fields are malformed (±Infinity, wrong types, negative
  positions) is refused with 400 and its slot is given back (`owned_slot`).
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
import websockets
from fastapi.testclient import TestClient

from dlr_runtime.engine.snapshot import read_header
from server.app import create_app
from server.sessions.restore import unseal
from tests.conftest import LM_NAME, SPEECH_NAME
from tests.server.conftest import LiveServer, make_settings
from tests.server.waits import eventually, eventually_sync
from tests.server.wshelp import SPEECH, TEXT, drop, send_json, speech_start, text_start

N = 25  # connections of each shape


def test_start_then_close_never_leaks_a_session_or_slot(models_dir):
    with LiveServer(make_settings(models_dir, resume_grace_s=0.5, max_sessions=8)) as srv:
        ctx = srv.app.state.dlr

        def open_websockets() -> float:
            return ctx.metrics.registry.get_sample_value("dlr_open_websockets")

        starts = {
            SPEECH: {"type": "start", "sample_rate": 16000},
            TEXT: {"type": "start"},
        }

        async def one(path: str, reset: bool) -> None:
            ws = await websockets.connect(srv.ws + path)
            try:
                await send_json(ws, starts[path])
            except websockets.ConnectionClosedError as e:  # refused at the handshake: the
                assert e.rcvd is not None and e.rcvd.code == 1013  # cap was full (on a slow
                return  # machine the refusal can arrive before the start is sent)
            if reset:
                drop(ws)  # TCP reset right after start, before ready could arrive
            else:
                await ws.close()  # clean close before reading ready

        async def main():
            for path in (SPEECH, TEXT):
                for reset in (False, True):
                    await asyncio.gather(*[one(path, reset) for _ in range(N)])
            # every handler has returned (a late one could still read its start and admit a
            # session after the count below), then every session is gone and its slot freed
            await eventually(lambda: open_websockets() == 0, timeout=20)
            await eventually(lambda: ctx.sessions == 0, timeout=20)
            await eventually(
                lambda: all(m.engine.pool.in_use == 0 for m in ctx.models.values()), timeout=10
            )
            # the server still admits up to its limit on both endpoints
            opened = [await speech_start(srv.ws) for _ in range(8)]
            opened += [await text_start(srv.ws) for _ in range(8)]
            for ws, _ in opened:
                await ws.close()
            await eventually(lambda: open_websockets() == 0 and ctx.sessions == 0, timeout=10)
            # (dropped sessions leave `live` when their 0.5 s resume grace ends)
            await eventually(lambda: not srv.app.state.sessions.live, timeout=10)
            async with httpx.AsyncClient() as h:
                return (await h.get(srv.http + "/readyz")).json()

        ready = asyncio.run(main())
        assert ready["sessions"] == 0 and not srv.app.state.sessions.live
        assert all(m.sessions == 0 for m in ctx.models.values())


@pytest.mark.parametrize("path", [SPEECH, TEXT])
def test_a_session_finished_while_it_is_being_parked_frees_its_slot_once(models_dir, path):
    """The race behind a rare leak: a session closed while `park` waits for the parked
    tier's write. It must end with its slot freed once, its count given back once, and no
    parked state left behind."""
    gate = threading.Event()
    with LiveServer(make_settings(models_dir, park_after_idle_s=0.3)) as srv:
        durable = srv.app.state.dlr.durable
        real_park = durable.park
        entered = threading.Event()

        async def slow_park(sid: str, blob: bytes) -> None:
            entered.set()
            while not gate.is_set():  # (the store write is slow: the session ends meanwhile)
                await asyncio.sleep(0.01)
            await real_park(sid, blob)

        durable.park = slow_park
        ctx = srv.app.state.dlr
        model = SPEECH_NAME if path == SPEECH else LM_NAME

        async def main():
            ws, ready = await (speech_start(srv.ws) if path == SPEECH else text_start(srv.ws))
            sess = srv.app.state.sessions.live[ready["session_id"]]
            await eventually(entered.is_set, timeout=10)
            await ws.close()  # a clean close finishes the session during the write
            await eventually(lambda: sess.closed, timeout=10)
            gate.set()
            await eventually(lambda: ctx.sessions == 0, timeout=10)
            await eventually(lambda: ctx.models[model].engine.pool.in_use == 0, timeout=10)
            await asyncio.sleep(0.3)  # (a second free or count would show by now)
            return sess

        sess = asyncio.run(main())
        assert not sess.parked and sess.end_reason == "client_closed"
        assert ctx.sessions == 0 and ctx.models[model].sessions == 0
        assert ctx.models[model].engine.pool.in_use == 0
        assert sess.sid not in durable.parked  # (the state written too late was dropped)


def _blob(c: TestClient, model: str, extra: dict) -> bytes:
    """A genuine (checksummed, signed) snapshot of a fresh slot carrying crafted session
    fields: what a holder of the state secret could make."""
    st = c.app.state.dlr
    m = st.models[model]
    slot = m.engine.open()
    try:
        return st.durable.seal(m, m.engine.snapshot(slot, extra))
    finally:
        m.engine.close(slot)


def _payload(c: TestClient, blob: bytes) -> bytes:
    """The engine snapshot inside an exported (signed) state blob."""
    return unseal(c.app.state.dlr, blob).payload


START = {"type": "start", "sample_rate": 16000, "encoding": "pcm_s16le", "model": None}


@pytest.mark.parametrize(
    "model,fields",
    [
        (SPEECH_NAME, {"consumed": float("inf")}),
        (SPEECH_NAME, {"bytes_received": float("-inf")}),
        (SPEECH_NAME, {"consumed": -5}),
        (SPEECH_NAME, {"buffered": 7}),
        (SPEECH_NAME, {"resampler": "not a dict"}),
        (SPEECH_NAME, {"start": {"type": "start", "sample_rate": 10**9}}),
        (LM_NAME, {"appended": float("inf")}),
        (LM_NAME, {"pending": 3}),
        (LM_NAME, {"pending": [10**9]}),
        (LM_NAME, {"last_logits": 5}),
    ],
)
def test_malformed_session_fields_give_400_and_free_the_slot(models_dir, model, fields):
    with TestClient(create_app(make_settings(models_dir, max_sessions=4))) as c:
        kind = "speech" if model == SPEECH_NAME else "text"
        path = "/v1/speech/stream" if kind == "speech" else "/v1/generate/stream"
        with c.websocket_connect(path) as ws:  # a real session's fields, then spoil some
            ws.send_json(START if kind == "speech" else {"type": "start"})
            ready = ws.receive_json()
            r = c.get(
                f"/v1/sessions/{ready['session_id']}/state",
                headers={"X-Resume-Token": ready["resume_token"]},
            )
            assert r.status_code == 200, r.text
        extra = {**read_header(_payload(c, r.content))["extra"], **fields}
        json.dumps(extra)  # (±Infinity is what a crafted JSON header carries)
        eng = c.app.state.dlr.models[model].engine
        for _ in range(6):  # more than max_sessions: a leak would end in 429
            r = c.post("/v1/sessions", content=_blob(c, model, extra))
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "invalid_state"
        eventually_sync(lambda: eng.pool.in_use == 0, timeout=5)
        assert c.get("/readyz").json()["sessions"] == 0
