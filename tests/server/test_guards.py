"""The small guards behind the hardening fixes, one by one: the origin/Host allow-list, the
lone-surrogate check, the JSON encoding boundary, the PCM clamp, the prompt token cap and the
request-body limits. (The black-box regression tests against a real server are tests/server/test_hardening.py.)"""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest
import websockets
from fastapi.testclient import TestClient

from server.app import create_app
from server.jsonsafe import SafeJSONResponse, dumps
from server.limits import RequestLimits
from server.origin import OriginPolicy, hostname
from server.sessions.speech import decode_pcm
from server.settings import Settings
from server.textcheck import may_hold_surrogates, surrogate_path
from tests.server.conftest import make_settings
from tests.server.live import LiveServer
from tests.server.waits import eventually
from tests.server.wshelp import TEXT


def policy(**kw) -> OriginPolicy:
    return OriginPolicy.of(Settings(**kw))


@pytest.mark.parametrize(
    ("netloc", "name"),
    [("127.0.0.1:80", "127.0.0.1"), ("[::1]:8000", "::1"), ("Example.COM", "example.com")],
)
def test_hostname(netloc, name):
    assert hostname(netloc) == name


@pytest.mark.parametrize(
    ("origin", "host", "ok"),
    [
        (None, "evil.example", True),  # not a browser
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://localhost:3000", "127.0.0.1:8000", True),  # loopback page
        ("http://[::1]:8000", "[::1]:8000", True),
        ("http://192.168.1.5:8000", "192.168.1.5:8000", True),  # same origin, IP literal
        ("http://evil.example", "127.0.0.1:8000", False),  # cross-site
        ("http://evil.example:8000", "evil.example:8000", False),  # DNS rebinding
        ("null", "127.0.0.1:8000", False),
        ("http://app.example", "127.0.0.1:8000", True),  # listed in cors_origins
        ("http://serve.lan:8000", "serve.lan:8000", True),  # allowed_hosts
    ],
)
def test_origin_policy_without_keys(origin, host, ok):
    p = policy(cors_origins="http://app.example", allowed_hosts="serve.lan")
    assert p.origin_ok(origin, host) is ok


def test_origin_policy_configured_host_and_keys():
    assert policy(host="dlr.example").origin_ok("http://dlr.example:80", "dlr.example:80")
    assert not policy().origin_ok("http://dlr.example:80", "dlr.example:80")
    # with API keys a rebinding page cannot authenticate: plain same-origin rule
    assert policy(api_keys="k").origin_ok("http://dlr.example:80", "dlr.example:80")
    assert policy(allowed_hosts="*").origin_ok("http://x.example", "x.example")


def test_surrogate_path_names_the_field():
    obj = json.loads('{"a": "ok", "messages": [{"content": "x"}, {"content": "y\\ud800"}]}')
    assert surrogate_path(obj) == "messages.1.content"
    assert surrogate_path(json.loads('{"text": "\\ud83d\\ude00"}')) is None  # a valid pair
    assert surrogate_path(json.loads('{"\\udfff": 1}')) == "body"
    assert surrogate_path(json.loads('"\\udc00"')) == "body"
    deep = json.loads("[" * 500 + '"\\ud800"' + "]" * 500)
    assert surrogate_path(deep) == ".".join(["0"] * 500)
    assert may_hold_surrogates(b'"\\uD800"') and not may_hold_surrogates(b'"\\u00e9"')


def test_json_boundary_never_writes_nan():
    msg = {"score": float("nan"), "top": [{"score": float("inf")}, {"score": 0.5}], "n": 3}
    out = json.loads(dumps(msg), parse_constant=lambda c: pytest.fail(c))
    assert out == {"score": None, "top": [{"score": None}, {"score": 0.5}], "n": 3}
    body = SafeJSONResponse({"x": -math.inf, "t": "é"}).body
    assert json.loads(body) == {"x": None, "t": "é"}


def test_f32_pcm_is_clamped_and_non_finite_refused():
    x = np.array([3e38, -3e38, 0.25, -1.5, 1e-45], dtype="<f4")
    y = decode_pcm(x.tobytes(), "pcm_f32le")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.array([1, -1, 0.25, -1, 1e-45], dtype=np.float32))
    with pytest.raises(ValueError, match="finite"):
        decode_pcm(np.array([np.nan], dtype="<f4").tobytes(), "pcm_f32le")


def test_prompt_cap_is_in_tokens_and_chunked_bodies_get_413(models_dir):
    app = create_app(make_settings(models_dir, max_prompt_tokens=100, max_state_bytes=4096))
    with TestClient(app) as c:
        r = c.post("/v1/generate", json={"prompt": "\U0001f600" * 30, "max_new_tokens": 1})
        assert r.status_code == 400, r.text  # 30 characters, 120 tokens
        assert r.json()["error"]["code"] == "prompt_too_long"
        assert r.json()["error"]["param"] == "prompt"
        r = c.post("/v1/generate", json={"prompt": "\U0001f600" * 20, "max_new_tokens": 1})
        assert r.status_code == 200, r.text
        r = c.post("/v1/sessions", content=(b"\0" * 1024 for _ in range(8)))
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "too_large"
        r = c.post("/v1/generate", content='{"prompt": "a\\udfff"}')  # (no content type)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def _drive(chunks: list[tuple[float, dict]]) -> tuple[list[dict], list[dict]]:
    """Run ASGI `app` on one POST whose receive() yields `chunks` (delay s, message) in order;
    (messages the app received, messages it sent)."""
    got, sent = [], []

    async def receive():
        delay, msg = chunks.pop(0) if chunks else (3600, {"type": "http.disconnect"})
        await asyncio.sleep(delay)
        return msg

    async def send(msg):
        sent.append(msg)

    async def main():
        scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": []}

        async def inner(scope, rcv, snd):
            while True:
                msg = await rcv()
                got.append(msg)
                if msg["type"] == "http.disconnect":
                    return
                if not msg.get("more_body"):
                    await snd({"type": "http.response.start", "status": 200, "headers": []})
                    await snd({"type": "http.response.body", "body": b"ok"})

        await asyncio.wait_for(
            RequestLimits(inner, Settings(body_timeout_s=0.1))(scope, receive, send), 10
        )

    asyncio.run(main())
    return got, sent


def test_body_deadline_covers_the_body_only():
    body = {"type": "http.request", "body": b"{}", "more_body": False}
    # the whole body came in time: a later wait for the disconnect (SSE) is not cut
    got, sent = _drive([(0, body), (0.3, {"type": "http.disconnect"})])
    assert [m["type"] for m in got] == ["http.request", "http.disconnect"]
    assert sent[0]["status"] == 200
    # a body that stops half-way: 408
    part = {"type": "http.request", "body": b"{", "more_body": True}
    got, sent = _drive([(0, part), (0.3, body)])
    assert sent[0]["status"] == 408, sent


def open_websockets(srv: LiveServer) -> float:
    return srv.app.state.dlr.metrics.registry.get_sample_value("dlr_open_websockets")


@pytest.mark.parametrize("cap", [0, 2])
def test_open_websockets_are_counted_until_their_handler_returns(models_dir, cap):
    async def main(srv: LiveServer) -> None:
        held = [await websockets.connect(srv.ws + TEXT) for _ in range(2)]
        assert open_websockets(srv) == 2
        if cap:  # one refused at the handshake is not held
            with pytest.raises(websockets.InvalidStatus):
                await websockets.connect(srv.ws + TEXT)
        else:
            held.append(await websockets.connect(srv.ws + TEXT))
        await eventually(lambda: open_websockets(srv) == len(held), timeout=10)
        for ws in held:
            await ws.close()
        await eventually(lambda: open_websockets(srv) == 0, timeout=10)

    with LiveServer(make_settings(models_dir, max_connections_per_client=cap)) as srv:
        asyncio.run(asyncio.wait_for(main(srv), 60))


def test_websockets_per_client_are_capped(models_dir):
    async def main(url: str) -> None:
        held = [await websockets.connect(url + TEXT) for _ in range(2)]
        with pytest.raises(websockets.InvalidStatus) as e:
            await websockets.connect(url + TEXT)
        assert e.value.response.status_code == 429
        await held[0].close()
        for _ in range(100):  # a freed place is usable again (once the server saw the close)
            try:
                again = await websockets.connect(url + TEXT)
                break
            except websockets.InvalidStatus:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the closed connection's place was never freed")
        for ws in (again, held[1]):
            await ws.close()

    with LiveServer(make_settings(models_dir, max_connections_per_client=2)) as srv:
        asyncio.run(asyncio.wait_for(main(srv.ws), 60))
