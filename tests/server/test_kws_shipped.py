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

# The shipped model's default operating point (threshold 0.8 over 400 ms of smoothed
# posteriors: of the windows and thresholds tried, the one detecting the most commands with
# <= 10 false accepts per hour on its valid streams, models/speech-commands/MODEL.md) is
# conservative: some of these espeak-ng commands stay under it (strict xfail: it turns into a
# failure the day a model that clears it ships). At threshold 0.4, a setting on the card's
# curve (77 % recall, 84 FA/h on its augmented test streams), every command fires and no other
# word does, whatever the sub-frame timing (benchmarks/bench_kws_phase.py: the en-us "stop"
# peaks at 0.50-0.79, the other words under 0.13).
MISSES_RECALL_GOAL = pytest.mark.xfail(
    SC12, strict=True, reason="the shipped model's default threshold misses some commands"
)
USER_THRESHOLD = 0.4
THRESHOLDS = [pytest.param(None, marks=MISSES_RECALL_GOAL, id="default"), USER_THRESHOLD]

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
