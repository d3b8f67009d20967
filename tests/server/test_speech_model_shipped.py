"""The shipped speech model through a real uvicorn server: SC12 labels in /v1/models, and a
non-command word / silence / a command from voices never heard in training come back as
``_unknown_`` / ``_silence_`` / the command over WS /v1/speech/stream."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets

from dlr_runtime import read_header
from tests.server.conftest import LiveServer, make_settings

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "speech-commands"
SC12 = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
SC12 += ["_silence_", "_unknown_"]

pytestmark = pytest.mark.skipif(
    not (SHIPPED / "config.json").is_file()
    or read_header(SHIPPED)["config"].labels[-1] != "_unknown_",
    reason="no SC12 model shipped in models/speech-commands",
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("shipped")
    shutil.copytree(SHIPPED, root / "speech-commands")
    with LiveServer(make_settings(root)) as srv:
        yield srv


def word(text: str, voice: str) -> np.ndarray:
    """`text` spoken by flite `voice` (a test voice of the shipped split), padded for the head."""
    from training.data.corpus import _to_int16 as clean  # the corpus' own trim + level
    from training.data.engines import flite_synthesize
    from training.data.labels import SAMPLE_RATE

    if shutil.which("flite") is None:
        pytest.skip("flite not installed")

    audio, rate = flite_synthesize(text, voice, 1.0, 115.0)
    x = clean(audio, rate).astype(np.float32) / 32767
    pad = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)
    rng = np.random.default_rng(0)
    out = np.concatenate([pad, x, pad])
    return out + 1e-3 * rng.standard_normal(len(out)).astype(np.float32)


async def final_of(url: str, audio: np.ndarray) -> dict:
    async with websockets.connect(url + "/v1/speech/stream", open_timeout=10) as ws:
        start = {"type": "start", "sample_rate": 16000, "encoding": "pcm_f32le"}
        await ws.send(json.dumps({**start, "interim_results": False}))
        ready = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert ready["type"] == "ready" and ready["labels"] == SC12
        for i in range(0, len(audio), 1600):
            await ws.send(np.asarray(audio[i : i + 1600], "<f4").tobytes())
        await ws.send(json.dumps({"type": "end"}))
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if msg["type"] == "final":
                return msg


def test_models_route_lists_the_sc12_labels(live):
    data = httpx.get(live.http + "/v1/models", timeout=10).json()["data"]
    speech = next(m for m in data if m["id"] == "speech-commands")
    assert speech["labels"] == SC12 and speech["kind"] == "speech"


def test_silence_is_silence(live):
    rng = np.random.default_rng(1)
    quiet = (1e-3 * rng.standard_normal(16000)).astype(np.float32)
    assert asyncio.run(final_of(live.ws, quiet))["label"] == "_silence_"


def test_a_non_command_word_is_unknown(live):
    final = asyncio.run(final_of(live.ws, word("house", "awb")))
    assert final["label"] == "_unknown_", final["top"]


def test_a_command_from_a_held_out_voice(live):
    final = asyncio.run(final_of(live.ws, word("stop", "awb")))
    assert final["label"] == "stop", final["top"]
