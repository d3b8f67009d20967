"""Continuous mode with the shipped speech model over a real uvicorn server: espeak-ng
commands with pauses come back as detections in order, once each, soon after each word.

With non-command words in between, only the commands may fire (the model's `_unknown_`
label). Each runs at the model's default operating point and at a user's lower threshold.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dlr_runtime import read_header
from tests.kws_audio import COMMANDS, MIXED, spoken_stream
from tests.server.conftest import LiveServer, make_settings
from tests.server.wshelp import recv_json, send_json, speech_start

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "speech-commands"
HAS_SHIPPED = (SHIPPED / "config.json").is_file()
SC12 = HAS_SHIPPED and "_unknown_" in read_header(SHIPPED)["config"].labels

# Each test runs at the shipped model's default operating point (its checkpoint metadata:
# the threshold and smoothing window that detect the most valid commands within 10 false
# accepts per hour, models/speech-commands/MODEL.md) and at a user's lower threshold, 0.4, a
# setting on the card's curve. The model shipped before the weight average missed some of these
# espeak-ng commands at its default (a strict xfail until this model cleared it).
USER_THRESHOLD = 0.4
THRESHOLDS = [pytest.param(None, id="default"), USER_THRESHOLD]

pytestmark = [
    pytest.mark.skipif(not HAS_SHIPPED, reason="no model in models/speech-commands"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("shipped-kws")
    shutil.copytree(SHIPPED, root / "speech-commands")
    with LiveServer(make_settings(root)) as srv:
        yield srv


async def detections(url: str, x: np.ndarray, **start) -> list[dict]:
    ws, _ = await speech_start(url, mode="continuous", interim_results=False, **start)
    pcm = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
    for i in range(0, len(pcm), 3200):
        await ws.send(pcm[i : i + 3200])
    await send_json(ws, {"type": "end"})
    out = []
    while (m := await recv_json(ws, timeout=60))["type"] != "final":
        out.append(m)
    await ws.close()
    assert [d["label"] for d in m["detections"]] == [d["label"] for d in out]
    return [d for d in out if d["type"] == "detection"]


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_commands_with_pauses_fire_once_each_in_order(live, threshold):
    x, where = spoken_stream(COMMANDS)
    if threshold is None and not SC12:
        threshold = 0.9  # the SC10 model has no operating point
    opts = {} if threshold is None else {"threshold": threshold}
    got = asyncio.run(detections(live.ws, x, **opts))
    assert [d["label"] for d in got] == COMMANDS
    for d, w in zip(got, where, strict=True):  # fires during the word or soon after it
        assert w.start_ms - 250 <= d["end_ms"] <= w.end_ms + 1000, (d, w)
        assert d["start_ms"] <= d["end_ms"]


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_only_the_commands_fire_among_other_words(live, threshold):
    x, where = spoken_stream(MIXED)
    got = asyncio.run(
        detections(live.ws, x, **({} if threshold is None else {"threshold": threshold}))
    )
    assert [d["label"] for d in got] == [w.word for w in where if w.word in COMMANDS]
