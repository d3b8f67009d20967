"""Fixtures of the client tests: a real dlr-serve (uvicorn, subprocess) on 127.0.0.1.

The server serves the tiny checkpoints of `models_dir` (tests/conftest.py); it is started once
per test session and stopped at the end. Its log goes to a temporary file that is printed if it
fails to come up.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parents[2]


@dataclass
class LiveServer:
    url: str
    proc: subprocess.Popen
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    models_dir: Path, log: Path, port: int | None = None, **settings: str
) -> LiveServer:
    """Start `python -m server.cli` (on a free port unless given); wait (<= 60 s) for /readyz."""
    port = port or free_port()
    env = {
        **os.environ,
        "DLR_MODELS_DIR": str(models_dir),
        "DLR_DEVICE": "cpu",
        **{f"DLR_{k.upper()}": str(v) for k, v in settings.items()},
    }
    cmd = [sys.executable, "-m", "server.cli", "--host", "127.0.0.1", "--port", str(port)]
    fh = log.open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dlr-serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return LiveServer(url, proc, log)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"dlr-serve did not become ready in 60 s:\n{log.read_text()}")


def stop_server(server: LiveServer) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=5)


@pytest.fixture(scope="session")
def live_server(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real server on 127.0.0.1 serving tiny-lm and tiny-speech."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = start_server(models_dir, log, partial_interval_ms="20")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start more servers (other models or settings); all are stopped at the end."""
    started: list[LiveServer] = []

    def start(models: Path, port: int | None = None, **settings: str) -> LiveServer:
        log = tmp_path_factory.mktemp("server") / "server.log"
        server = start_server(models, log, port, **settings)
        started.append(server)
        return server

    yield start
    for server in started:
        stop_server(server)


@pytest.fixture(scope="session")
def word_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A spoken command ("yes", espeak-ng, 16 kHz mono int16, centred in 1 s)."""
    from training.data.speech_synth import synthesize_clip

    x = synthesize_clip("yes", "en-us", 160, 50)  # (16000,) float32, word centred in 1 s
    path = tmp_path_factory.mktemp("audio") / "yes.wav"
    sf.write(path, x, 16000, subtype="PCM_16")
    return path
