"""Sessions that survive a dropped connection: resume with id + token continues exactly where
the session was (outputs equal an uninterrupted run), replay of missed messages, grace expiry,
and state export/import between two servers (real uvicorn + `websockets`)."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import torch
import websockets

from dlr_runtime import DLRModel, save_checkpoint
from tests.conftest import LM_NAME, SPEECH_NAME, TOKENIZER, tiny_lm_config, write_models
from tests.server.conftest import LiveServer, make_settings
from tests.server.waits import eventually
from tests.server.wshelp import (
    SPEECH,
    TEXT,
    drop,
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

CHUNK = 3200  # bytes = 100 ms of 16 kHz pcm_s16le
SECRET = "state-secret-of-these-replicas-0123"  # exported states verify where it is the same


@pytest.fixture(scope="module")
def srv(models_dir):
    with LiveServer(make_settings(models_dir, resume_grace_s=20.0, state_secret=SECRET)) as s:
        yield s


def clip(seed: int, seconds: float = 1.5) -> bytes:
    """A deterministic test signal (tones + noise) as pcm_s16le."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    x = 0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.05 * rng.standard_normal(t.size)
    return s16(x.astype(np.float32))


def slots_in_use(srv: LiveServer, model: str) -> int:
    return srv.app.state.dlr.models[model].engine.pool.in_use


def detached(srv: LiveServer, sid: str) -> bool:
    sess = srv.app.state.sessions.live.get(sid)
    return sess is not None and sess.detached_since is not None


def test_speech_resume_equals_uninterrupted(srv):
    data = clip(1)

    async def main():
        solo = await speech_solo(srv.ws, data, CHUNK)
        ws, ready = await speech_start(srv.ws)
        half = len(data) // 2 // CHUNK * CHUNK + 1000  # not on a chunk boundary
        for i in range(0, half, CHUNK):
            await ws.send(data[i : min(i + CHUNK, half)])
        seen = [await recv_json(ws)]  # at least one partial arrived
        drop(ws)  # the server notices; the audio it got is still processed
        await eventually(lambda: detached(srv, ready["session_id"]))
        ws2, again = await resume(srv.ws, SPEECH, ready, last_seq=seen[-1]["seq"])
        assert again["session_id"] == ready["session_id"]
        sent = again["bytes_received"]
        assert 0 < sent <= half and again["labels"] == ready["labels"]
        for i in range(sent, len(data), CHUNK):
            await ws2.send(data[i : i + CHUNK])
        await send_json(ws2, {"type": "end"})
        final = await until_final(ws2, seen)
        await ws2.close()
        return solo, final, seen

    solo, final, seen = asyncio.run(main())
    assert final["audio_ms"] == solo["audio_ms"] == pytest.approx(len(data) / 2 / 16)
    assert final["label"] == solo["label"]
    assert final["score"] == pytest.approx(solo["score"], abs=2e-6)
    assert [m["seq"] for m in seen] == list(range(1, len(seen) + 1))  # none lost or repeated


def test_text_resume_mid_generation_replays_and_continues(srv):
    gen = {"max_new_tokens": 40, "temperature": 0.8, "seed": 7}

    async def main():
        ws, _ = await text_start(srv.ws)
        t1, _ = await text_turn(ws, "Hello there", gen)
        t2, _ = await text_turn(ws, " and then", gen)
        await ws.close()
        # the same conversation, dropped after a few tokens of the first turn
        ws, ready = await text_start(srv.ws)
        await send_json(ws, {"type": "append", "text": "Hello there"})
        await send_json(ws, {"type": "generate", **gen})
        got = [await recv_json(ws) for _ in range(3)]
        drop(ws)
        await eventually(lambda: detached(srv, ready["session_id"]))
        ws2, again = await resume(srv.ws, TEXT, ready, last_seq=got[-1]["seq"])
        assert again["messages_received"] == 2
        rest, done = await text_collect(ws2, got)
        r1 = "".join(m["text"] for m in got[:3]) + rest
        r2, _ = await text_turn(ws2, " and then", gen)
        await ws2.close()
        return (t1, t2), (r1, r2), got, done

    solo, resumed, got, done = asyncio.run(main())
    assert resumed == solo
    assert done["usage"]["completion_tokens"] == 40
    assert [m["seq"] for m in got] == list(range(1, len(got) + 1))


def test_resume_refusals_and_grace_expiry(models_dir):
    with LiveServer(make_settings(models_dir, resume_grace_s=0.5)) as s:

        async def main():
            ws, ready = await speech_start(s.ws)
            await ws.send(clip(2, 0.2))
            live = s.app.state.sessions.live
            await eventually(lambda: live[ready["session_id"]].bytes_received == 6400)
            drop(ws)
            out = {}
            for name, bad in (
                ("token", {**ready, "resume_token": "x" * 43}),
                ("id", {**ready, "session_id": "0" * 32}),
            ):
                ws = await websockets.connect(s.ws + SPEECH)
                await send_json(
                    ws, {"type": "resume", **{k: bad[k] for k in ("session_id", "resume_token")}}
                )
                out[name] = await recv_json(ws)
                await ws.wait_closed()
                out[name + "_close"] = ws.close_code
            # a text endpoint does not resume a speech session
            ws = await websockets.connect(s.ws + TEXT)
            await send_json(
                ws,
                {
                    "type": "resume",
                    "session_id": ready["session_id"],
                    "resume_token": ready["resume_token"],
                },
            )
            out["kind"] = await recv_json(ws)
            await ws.close()
            out["held"] = slots_in_use(s, SPEECH_NAME)  # (detached: resumes were refused)
            # grace over: the slot is freed
            await eventually(lambda: slots_in_use(s, SPEECH_NAME) == 0, timeout=5)
            out["after"] = slots_in_use(s, SPEECH_NAME)
            ws = await websockets.connect(s.ws + SPEECH)
            await send_json(
                ws,
                {
                    "type": "resume",
                    "session_id": ready["session_id"],
                    "resume_token": ready["resume_token"],
                },
            )
            out["expired"] = await recv_json(ws)
            await ws.close()
            out["metrics"] = httpx.get(s.http + "/metrics").text
            return out

        out = asyncio.run(main())
    for k in ("token", "id", "kind", "expired"):
        assert out[k]["type"] == "error" and out[k]["code"] == "invalid_resume", out[k]
    assert out["token_close"] == out["id_close"] == 1008
    assert out["held"] == 1 and out["after"] == 0
    assert (
        f'dlr_evictions_total{{model="{SPEECH_NAME}",reason="resume_expired"}} 1.0'
        in out["metrics"]
    )


def test_clean_close_frees_the_slot_at_once(srv):
    async def main():
        ws, _ = await speech_start(srv.ws)
        await ws.close()  # 1000: the client is done, nothing to keep (grace is 20 s)
        await eventually(lambda: slots_in_use(srv, SPEECH_NAME) == 0, timeout=5)
        return slots_in_use(srv, SPEECH_NAME)

    assert asyncio.run(main()) == 0


def test_export_import_between_servers(srv, models_dir, tmp_path):
    """A text session exported from one server continues on another; a speech stream too.
    Wrong token, tampered blob and a blob of other weights are refused with 4xx JSON."""
    other = tmp_path / "other"
    write_models(other)
    changed = tmp_path / "changed"
    save_checkpoint(DLRModel(tiny_lm_config(), seed=9), changed / LM_NAME, tokenizer=TOKENIZER)
    gen = {"max_new_tokens": 12, "temperature": 0.7, "seed": 3}
    data = clip(3)
    with (
        LiveServer(make_settings(other, resume_grace_s=20.0, state_secret=SECRET)) as b,
        LiveServer(make_settings(changed, resume_grace_s=20.0, state_secret=SECRET)) as c,
        LiveServer(make_settings(other, resume_grace_s=20.0)) as d,  # another secret
    ):

        async def main():
            out = {}
            ws, ready = await text_start(srv.ws)
            await text_turn(ws, "first turn", gen)
            async with httpx.AsyncClient(timeout=30) as h:
                url = f"{srv.http}/v1/sessions/{ready['session_id']}/state"
                r = await h.get(url, headers={"X-Resume-Token": ready["resume_token"]})
                assert r.status_code == 200, r.text
                blob = r.content
                out["wrong_token"] = await h.get(url, headers={"X-Resume-Token": "nope"})
                expect, _ = await text_turn(ws, " second", gen)  # the original continues
                await ws.close()
                r = await h.post(b.http + "/v1/sessions", content=blob)
                assert r.status_code == 201, r.text
                moved = r.json()
                bad = bytearray(blob)
                bad[len(bad) // 2] ^= 1
                out["tampered"] = await h.post(b.http + "/v1/sessions", content=bytes(bad))
                out["other_weights"] = await h.post(c.http + "/v1/sessions", content=blob)
                out["garbage"] = await h.post(b.http + "/v1/sessions", content=b"hello")
                out["other_secret"] = await h.post(d.http + "/v1/sessions", content=blob)
                ws, again = await resume(b.ws, TEXT, moved)
                got, _ = await text_turn(ws, " second", gen)
                await ws.close()
                out["text"] = (expect, got, moved["model"], moved["kind"])
                # speech: half the clip on srv, export, the rest on b
                solo = await speech_solo(srv.ws, data, CHUNK)
                ws, ready = await speech_start(srv.ws, interim_results=False)
                half = len(data) // 2
                await ws.send(data[:half])
                live = srv.app.state.sessions.live
                await eventually(lambda: live[ready["session_id"]].bytes_received == half)
                url = f"{srv.http}/v1/sessions/{ready['session_id']}/state"
                r = await h.get(url, headers={"X-Resume-Token": ready["resume_token"]})
                await ws.close()
                moved = (await h.post(b.http + "/v1/sessions", content=r.content)).json()
                ws, again = await resume(b.ws, SPEECH, moved)
                assert again["bytes_received"] == half
                await ws.send(data[half:])
                await send_json(ws, {"type": "end"})
                final = await until_final(ws, [])
                await ws.close()
                out["speech"] = (solo, final)
            return out

        out = asyncio.run(main())
    expect, got, model, kind = out["text"]
    assert got == expect and model == LM_NAME and kind == "text"
    for key, status, code in (
        ("wrong_token", 400, "resume_token_unsigned"),  # (not a signed token)
        ("tampered", 400, "invalid_state"),
        ("garbage", 400, "invalid_state"),
        ("other_secret", 400, "invalid_state"),
        ("other_weights", 409, "state_model_mismatch"),
    ):
        r = out[key]
        assert r.status_code == status, (key, r.text)
        assert r.json()["error"]["code"] == code and r.json()["error"]["message"]
    for key, reason in (("tampered", "bad_signature"), ("garbage", "unsigned")):
        assert reason in out[key].json()["error"]["message"]
    assert "bad_signature" in out["other_secret"].json()["error"]["message"]
    solo, final = out["speech"]
    assert final["label"] == solo["label"] and final["audio_ms"] == solo["audio_ms"]
    assert final["score"] == pytest.approx(solo["score"], abs=2e-6)
    assert json.dumps(final)  # plain JSON
    assert torch is not None
