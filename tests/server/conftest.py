"""Server fixtures: a TestClient app and a real uvicorn server on 127.0.0.1 (tiny models)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from server.app import create_app
from server.cli import uvicorn_config
from server.drain import DrainingServer
from server.settings import Settings


def make_settings(models_dir: Path, **kw) -> Settings:
    base = dict(
        models_dir=models_dir,
        device="cpu",
        max_sessions=64,
        max_batch_wait_ms=2.0,
        partial_interval_ms=0.0,
        idle_timeout_s=30.0,
        torch_threads=1,
    )
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def client(models_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(models_dir))) as c:
        yield c


class LiveServer:
    """uvicorn in a background thread on a free loopback port."""

    def __init__(self, settings: Settings) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app = create_app(settings)
        cfg = uvicorn_config(
            self.app, settings, host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = DrainingServer(cfg, self.app.state.sessions)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.http + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


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


class ServerProcess:
    """`dlr-serve` as a real subprocess on a free loopback port (for SIGTERM and RSS tests)."""

    def __init__(self, models_dir: Path, log_path: Path, **settings) -> None:
        import os
        import sys

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLR_")}
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        base = dict(
            models_dir=models_dir,
            host="127.0.0.1",
            port=self.port,
            device="cpu",
            partial_interval_ms=0,
            log_level="info",
        )
        base.update(settings)
        env.update({f"DLR_{k.upper()}": str(v) for k, v in base.items()})
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115  (closed in stop)
        exe = Path(sys.executable).with_name("dlr-serve")
        import subprocess

        self.proc = subprocess.Popen([str(exe)], env=env, stdout=self._log, stderr=self._log)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 90) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dlr-serve exited: {self.log()}")
            try:
                if httpx.get(self.http + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"dlr-serve did not get ready: {self.log()}")

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def terminate(self, timeout: float = 60) -> int:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def __enter__(self) -> ServerProcess:
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if not self._log.closed:
            self._log.close()
