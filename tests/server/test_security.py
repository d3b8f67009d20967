"""API keys (HTTP bearer, WebSocket header or `bearer.<key>` subprotocol), public health and
metrics, WebSocket origin checks and CORS, request-size caps, and model loading confined to the
models directory (safetensors checkpoints only, validated names)."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import pytest
import websockets
from fastapi.testclient import TestClient

from server.app import create_app
from tests.conftest import LM_NAME, SPEECH_NAME, write_models
from tests.server.conftest import LiveServer, make_settings
from tests.server.wshelp import SPEECH, TEXT, recv_json

KEYS = "key-one,key-two"


@pytest.fixture(scope="module")
def keyed(models_dir):
    with LiveServer(make_settings(models_dir, api_keys=KEYS)) as srv:
        yield srv


def test_http_needs_a_key_except_health_and_metrics(keyed):
    h = keyed.http
    for path in ("/healthz", "/readyz", "/metrics", "/"):
        assert httpx.get(h + path).status_code == 200, path
    for path in ("/v1/models", "/openapi.json", "/v1/sessions/x/state"):
        r = httpx.get(h + path)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert httpx.get(h + path, headers={"Authorization": "Bearer nope"}).status_code == 401
    ok = httpx.get(h + "/v1/models", headers={"Authorization": "Bearer key-two"})
    assert ok.status_code == 200
    body = {"prompt": "a", "max_new_tokens": 1}
    assert httpx.post(h + "/v1/generate", json=body).status_code == 401
    r = httpx.post(h + "/v1/generate", json=body, headers={"Authorization": "Bearer key-one"})
    assert r.status_code == 200


def test_websocket_key_in_header_or_subprotocol(keyed):
    async def main():
        out = {}
        try:
            await websockets.connect(keyed.ws + SPEECH)
        except websockets.InvalidStatus as e:
            out["none"] = (e.response.status_code, json.loads(e.response.body))
        try:
            await websockets.connect(keyed.ws + TEXT, subprotocols=["bearer.wrong"])
        except websockets.InvalidStatus as e:
            out["wrong"] = e.response.status_code
        async with websockets.connect(
            keyed.ws + SPEECH, additional_headers={"Authorization": "Bearer key-one"}
        ) as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
            out["header"] = (await recv_json(ws))["type"]
        async with websockets.connect(
            keyed.ws + TEXT, subprotocols=["dlr.v1", "bearer.key-two"]
        ) as ws:
            out["subprotocol"] = ws.subprotocol
            await ws.send(json.dumps({"type": "start"}))
            out["sub_ready"] = (await recv_json(ws))["type"]
        return out

    out = asyncio.run(main())
    assert out["none"][0] == 401 and out["none"][1]["error"]["code"] == "unauthorized"
    assert out["wrong"] == 401
    assert out["header"] == "ready" and out["sub_ready"] == "ready"
    assert out["subprotocol"] == "dlr.v1"


def test_origins_and_cors(models_dir):
    async def ws_status(url: str, origin: str | None) -> int:
        try:
            kw = {"origin": origin} if origin else {}
            async with websockets.connect(url + SPEECH, **kw):
                return 101
        except websockets.InvalidStatus as e:
            return e.response.status_code

    with LiveServer(make_settings(models_dir)) as srv:
        own = f"http://127.0.0.1:{srv.port}"
        codes = [asyncio.run(ws_status(srv.ws, o)) for o in (None, own, "http://evil.example")]
        assert codes == [101, 101, 403]
        r = httpx.options(
            srv.http + "/v1/generate",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in r.headers
    with LiveServer(make_settings(models_dir, cors_origins="http://app.example")) as srv:
        assert asyncio.run(ws_status(srv.ws, "http://app.example")) == 101
        assert asyncio.run(ws_status(srv.ws, "http://evil.example")) == 403
        r = httpx.options(
            srv.http + "/v1/generate",
            headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"},
        )
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://app.example"


def test_request_size_and_field_caps(models_dir):
    s = make_settings(models_dir, max_request_bytes=2048, max_prompt_chars=100, max_new_tokens=8)
    with TestClient(create_app(s)) as c:
        r = c.post("/v1/generate", json={"prompt": "x" * 5000, "max_new_tokens": 1})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
        r = c.post("/v1/generate", json={"prompt": "x" * 101, "max_new_tokens": 1})
        assert r.status_code == 422 and r.json()["error"]["param"] == "prompt"
        r = c.post("/v1/generate", json={"prompt": "x", "max_new_tokens": 9})
        assert r.status_code == 422 and r.json()["error"]["param"] == "max_new_tokens"
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 9})
        assert r.status_code == 422
        r = c.post(
            "/v1/generate", json={"prompt": "x", "max_new_tokens": 1, "model": "../" + LM_NAME}
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_models_load_only_from_the_models_dir(tmp_path):
    root = write_models(tmp_path / "models")
    outside = write_models(tmp_path / "outside")
    (root / "linked").symlink_to(outside / LM_NAME, target_is_directory=True)  # escapes root
    shutil.copytree(root / LM_NAME, root / ".hidden")  # invalid name
    pickled = root / "pickled"
    pickled.mkdir()
    shutil.copy(root / LM_NAME / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")  # never unpickled
    with TestClient(create_app(make_settings(root))) as c:
        names = sorted(m["name"] for m in c.get("/v1/models").json()["data"])
    assert names == sorted([LM_NAME, SPEECH_NAME])
