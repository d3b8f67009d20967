"""Resume tokens are signed like the other portable blobs (server/sessions/tokens.py): an HMAC
envelope around the session's secret, bound to the session id, the model's content hash and
the token format, with an expiry. Unsigned, tampered, truncated, wrong-session, wrong-model
and expired tokens are refused with the reason named: over the WebSocket an `invalid_resume`
error with `reason` then close 1008; over HTTP (`X-Resume-Token`) a 4xx whose code is
`resume_token_<reason>`. A resume renews the token (same secret, new expiry)."""

from __future__ import annotations

import asyncio
import base64
import time
from types import SimpleNamespace

import httpx
import pytest
import websockets
from hypothesis import given, settings
from hypothesis import strategies as st

from server.sessions.tokens import PREFIX, RAW, TOKEN_VERSION, TokenRefused, issue, open_token
from server.store import StateSigner
from tests.conftest import LM_NAME
from tests.server.conftest import LiveServer, make_settings
from tests.server.wshelp import recv_json, send_json, text_start, text_turn

SECRET = "test-secret-of-resume-tokens-0123456789"
TEXT = "/v1/generate/stream"
GEN = {"max_new_tokens": 8, "temperature": 0.0}


def blob_of(token: str) -> bytes:
    body = token[len(PREFIX) :]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def token_of(blob: bytes) -> str:
    return PREFIX + base64.urlsafe_b64encode(blob).rstrip(b"=").decode()


def crafted(secret: bytes, model_hash: str, sid: str, ttl: float | None, now: float) -> str:
    """A token signed with the server's own secret (what a replica could make)."""
    signer = StateSigner(SECRET.encode())
    return token_of(signer.sign(secret, LM_NAME, model_hash, TOKEN_VERSION, ttl, sid, now=now))


async def resume_with(url: str, sid: str, token: str) -> tuple[dict, int | None]:
    ws = await websockets.connect(url + TEXT)
    await send_json(ws, {"type": "resume", "session_id": sid, "resume_token": token})
    msg = await recv_json(ws)
    if msg.get("type") == "error":
        await asyncio.wait_for(ws.wait_closed(), 10)
        return msg, ws.close_code
    await ws.close(code=4000)  # a drop (1000 would end the session)
    return msg, None


def test_resume_token_refusals_name_their_reason(models_dir):
    with LiveServer(make_settings(models_dir, state_secret=SECRET, state_ttl_s=600)) as srv:
        model_hash = srv.app.state.dlr.models[LM_NAME].engine.config_hash

        async def main():
            ws, a = await text_start(srv.ws)
            first = (await text_turn(ws, "Hello", GEN))[0]
            await ws.close(code=4000)  # dropped: kept for resume
            ws_b, b = await text_start(srv.ws)
            sid, tok = a["session_id"], a["resume_token"]
            raw = bytearray(blob_of(tok))
            secret = bytes(raw[-64:-32])  # (the payload: the session's secret)
            raw[-40] ^= 1  # one bit of the secret
            now = time.time()
            cases = {
                "unsigned": "x" * 43,
                "bad_signature": token_of(bytes(raw)),
                "truncated": token_of(blob_of(tok)[:-5]),
                "wrong_session": b["resume_token"],
                "wrong_model": crafted(secret, "0" * len(model_hash), sid, 600, now),
                "expired": crafted(secret, model_hash, sid, 1.0, now - 100),
                "malformed": PREFIX + "!!!",
            }
            out = {k: await resume_with(srv.ws, sid, t) for k, t in cases.items()}
            async with httpx.AsyncClient(timeout=10) as h:
                url = f"{srv.http}/v1/sessions/{sid}/state"
                http = {
                    k: await h.get(url, headers={"X-Resume-Token": cases[k]})
                    for k in ("unsigned", "bad_signature", "wrong_model", "expired")
                }
            # the real token (and a replica's token of the same secret) still resume
            ok, _ = await resume_with(srv.ws, sid, crafted(secret, model_hash, sid, 600, now))
            ws = await websockets.connect(srv.ws + TEXT)
            await send_json(ws, {"type": "resume", "session_id": sid, "resume_token": tok})
            again = await recv_json(ws)
            second = (await text_turn(ws, " again", GEN))[0]
            await ws.close(code=4000)
            renewed, _ = await resume_with(srv.ws, sid, again["resume_token"])
            await ws_b.close()
            return out, http, ok, again, renewed, first, second

        out, http, ok, again, renewed, first, second = asyncio.run(main())
    for reason, (msg, close) in out.items():
        assert msg["type"] == "error" and msg["code"] == "invalid_resume", (reason, msg)
        assert msg["reason"] == reason, (reason, msg)
        assert close == 1008
    assert {k: (r.status_code, r.json()["error"]["code"]) for k, r in http.items()} == {
        "unsigned": (400, "resume_token_unsigned"),
        "bad_signature": (400, "resume_token_bad_signature"),
        "wrong_model": (409, "resume_token_wrong_model"),
        "expired": (410, "resume_token_expired"),
    }
    assert ok["type"] == "ready" and ok["resumed"] is True
    assert again["resumed"] is True and again["resume_token"].startswith(PREFIX)
    assert renewed["type"] == "ready" and renewed["resumed"] is True
    assert first and second


def fake_ctx(hashes: list[str]) -> SimpleNamespace:
    models = {f"m{i}": SimpleNamespace(name=f"m{i}", engine=SimpleNamespace(config_hash=h))
              for i, h in enumerate(hashes)}  # fmt: skip
    durable = SimpleNamespace(signer=StateSigner(SECRET.encode()))
    return SimpleNamespace(
        durable=durable, models=models, settings=SimpleNamespace(state_ttl_s=3600.0)
    )


SID = "ab" * 16
CTX = fake_ctx(["a" * 64, "b" * 64])
SECRET32 = bytes(range(32))
GOOD = issue(CTX, CTX.models["m1"], SID, SECRET32)


def test_a_token_opens_for_its_session_and_any_served_model_only() -> None:
    assert open_token(CTX, SID, GOOD) == SECRET32
    with pytest.raises(TokenRefused) as e:
        open_token(fake_ctx(["c" * 64]), SID, GOOD)
    assert e.value.reason == "wrong_model" and e.value.status == 409
    with pytest.raises(TokenRefused) as e:
        open_token(CTX, "cd" * 16, GOOD)
    assert e.value.reason == "wrong_session"
    state = CTX.durable.signer.sign(b"\0" * 5000, "m1", "b" * 64, 1, None, SID)
    with pytest.raises(TokenRefused) as e:  # a signed state blob is no token
        open_token(CTX, SID, token_of(state))
    assert e.value.reason == "too_large"


@settings(max_examples=300, deadline=None)
@given(pos=st.integers(0, len(GOOD) - 1), ch=st.characters(codec="ascii"))
def test_no_changed_character_opens(pos: int, ch: str) -> None:
    """Any one character replaced: refused with a reason, or (base64 slack in the last
    character) the same secret; never another secret."""
    bad = GOOD[:pos] + ch + GOOD[pos + 1 :]
    try:
        got = open_token(CTX, SID, bad)
    except TokenRefused as e:
        assert e.reason and 400 <= e.status < 500
    else:
        assert got == SECRET32


def test_without_a_configured_secret_tokens_are_raw_and_a_signing_server_refuses_them() -> None:
    """No DLR_STATE_SECRET: the random signer dies with the process, so tokens are the raw
    secret (they survive a drain and restart); a server with a secret takes signed only."""
    local = fake_ctx(["b" * 64])
    local.durable.signer = StateSigner(bytes(32), generated=True)
    raw = issue(local, local.models["m0"], SID, SECRET32)
    assert raw.startswith(RAW) and open_token(local, SID, raw) == SECRET32
    with pytest.raises(TokenRefused) as e:
        open_token(CTX, SID, raw)
    assert e.value.reason == "unsigned"
    for bad in (RAW + "zz", RAW + "ab" * 8):
        with pytest.raises(TokenRefused) as e:
            open_token(local, SID, bad)
        assert e.value.reason == "malformed"
