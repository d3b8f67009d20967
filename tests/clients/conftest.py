"""Fixtures of the client tests: the live dlr-serve (tests/server/live.py) on 127.0.0.1.

The server serves the tiny checkpoints of `models_dir` (tests/conftest.py); `live_server` is
started once per test session, `server_factory` starts more (other models or settings); all are
stopped (drained) at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import soundfile as sf

from tests.server.conftest import make_settings
from tests.server.live import LiveServer


def start_server(models_dir: Path, port: int | None = None, **settings: str) -> LiveServer:
    """A live server on `port` (a free one unless given), ready (<= 90 s)."""
    return LiveServer(make_settings(models_dir, **settings), port=port).start()


@pytest.fixture(scope="session")
def live_server(models_dir: Path) -> Iterator[LiveServer]:
    """A real server on 127.0.0.1 serving tiny-lm and tiny-speech."""
    server = start_server(models_dir, partial_interval_ms="20")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def server_factory() -> Iterator:
    """Start more servers (other models or settings); all are stopped at the end."""
    started: list[LiveServer] = []

    def start(models: Path, port: int | None = None, **settings: str) -> LiveServer:
        server = start_server(models, port, **settings)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def word_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A spoken command ("yes", espeak-ng, 16 kHz mono int16, centred in 1 s)."""
    from training.data.speech_synth import synthesize_clip

    x = synthesize_clip("yes", "en-us", 160, 50)  # (16000,) float32, word centred in 1 s
    path = tmp_path_factory.mktemp("audio") / "yes.wav"
    sf.write(path, x, 16000, subtype="PCM_16")
    return path
