"""Server fixtures: a TestClient app and the live server (tests/server/live.py) on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from server.app import create_app
from server.settings import Settings
from tests.server.live import LiveServer


def make_settings(models_dir: Path, **kw) -> Settings:
    base = dict(
        models_dir=models_dir,
        device="cpu",
        max_sessions=64,
        max_batch_wait_ms=2.0,
        partial_interval_ms=0.0,
        idle_timeout_s=30.0,
        torch_threads=1,
        gc_freeze=False,  # (in-process servers: a full collection of the test process each)
    )
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def client(models_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(models_dir))) as c:
        yield c


@pytest.fixture(scope="module")
def live(models_dir: Path) -> Iterator[LiveServer]:
    with LiveServer(make_settings(models_dir)) as srv:
        yield srv


def run(coro):
    return asyncio.run(coro)


def expect_error(ws, code: str, close: int) -> None:
    """The next message is an error with `code`, then the server closes with `close`."""
    msg = ws.receive_json()
    assert msg["type"] == "error" and msg["code"] == code, msg
    assert msg["message"]
    with pytest.raises(WebSocketDisconnect) as e:
        ws.receive_json()
    assert e.value.code == close


def play_until_error(ws, messages: list, code: str, close: int, valid_start) -> None:
    """Send text (str), binary (bytes) or JSON (dict) messages; after each start message that
    `valid_start(msg)` accepts, read its ready; then expect the error `code` and close."""
    for m in messages:
        if isinstance(m, bytes):
            ws.send_bytes(m)
        elif isinstance(m, str):
            ws.send_text(m)
        else:
            ws.send_json(m)
            if m.get("type") == "start" and valid_start(m):
                assert ws.receive_json()["type"] == "ready"
    expect_error(ws, code, close)


def process_server(models_dir: Path, log_path: Path, **settings) -> LiveServer:
    """The real `dlr-serve` command as a subprocess (SIGTERM, RSS); defaults as in production
    but for the tiny models, the CPU and unthrottled partials."""
    base = dict(models_dir=models_dir, device="cpu", partial_interval_ms=0, log_level="info")
    base.update(settings)
    return LiveServer(Settings(**base), process=True, log_path=log_path)
