"""One hour of real-time-equivalent speech through one WebSocket session, sent as fast as the
server allows (a tiny model with 50 ms frames and 8 s messages, so it takes well under a
minute): the final equals the recurrent model over the whole hour, every message arrives in
order, and the server's memory stays flat (RSS growth after warm-up bounded, see RSS_GROWTH)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import torch
import websockets

from dlr_runtime import DLRConfig, DLRModel, load_recurrent, save_checkpoint
from tests.conftest import LABELS
from tests.server.conftest import process_server

HOUR_S = 3600
MSG_S = 8  # seconds of audio per WebSocket message
RATE = 16000
RSS_GROWTH = 16 << 20  # bytes: server RSS after the first 10 % vs at the end of the hour


def frame(i: int) -> np.ndarray:
    """Message i of the hour, as int16 samples (deterministic)."""
    rng = np.random.default_rng(i)
    t = np.arange(MSG_S * RATE) / RATE
    x = 0.2 * np.sin(2 * np.pi * (100 + i % 50 * 10) * t) + 0.05 * rng.standard_normal(t.size)
    return (x * 32767).astype("<i2")


@pytest.fixture(scope="module")
def hour_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("hour")
    cfg = DLRConfig.preset("micro-speech", sample_rate=RATE, frame_stride=800, labels=list(LABELS))
    save_checkpoint(DLRModel(cfg, seed=5), root / "hour-speech")
    return root


def reference_scores(path) -> torch.Tensor:
    rec = load_recurrent(path)
    state = rec.init_state(1)
    for i in range(HOUR_S // MSG_S):
        x = torch.from_numpy(frame(i).astype(np.float32) / 32768.0).unsqueeze(0)  # (1, T)
        _, state = rec.chunk(x, state)
    return torch.softmax(rec.scores(state)[0].double(), -1)  # (C,)


@pytest.mark.slow  # a dlr-serve subprocess (or two) and tens of seconds of load
def test_one_hour_stream_correct_and_flat_memory(hour_model, tmp_path):
    n_msgs = HOUR_S // MSG_S
    srv = process_server(
        hour_model,
        tmp_path / "server.log",
        max_chunk_frames=4096,
        backpressure_audio_s=20,
        max_queued_audio_s=40,
        partial_interval_ms=1000,
        log_level="warning",
    )
    with srv:

        async def main():
            rss = {}
            async with websockets.connect(srv.ws + "/v1/speech/stream", max_size=None) as ws:
                await ws.send(json.dumps({"type": "start", "sample_rate": RATE}))
                assert json.loads(await ws.recv())["type"] == "ready"
                msgs = []

                async def reader():
                    while True:
                        m = json.loads(await ws.recv())
                        msgs.append(m)
                        if m["type"] != "partial":
                            return m

                task = asyncio.create_task(reader())
                t0 = time.monotonic()
                for i in range(n_msgs):
                    await ws.send(frame(i).tobytes())
                    if i == n_msgs // 10:
                        await asyncio.sleep(0.5)
                        rss["warm"] = srv.rss_bytes()
                await ws.send(json.dumps({"type": "end"}))
                final = await asyncio.wait_for(task, 120)
                rss["end"] = srv.rss_bytes()
                return final, msgs, time.monotonic() - t0, rss

        final, msgs, elapsed, rss = asyncio.run(main())
    ref = reference_scores(hour_model / "hour-speech")
    print(
        f"hour stream: {elapsed:.1f} s wall, RSS {rss['warm'] / 2**20:.1f} -> {rss['end'] / 2**20:.1f} MiB"
    )
    assert final["type"] == "final", final
    assert final["audio_ms"] == HOUR_S * 1000
    assert final["label"] == LABELS[int(ref.argmax())]
    assert final["score"] == pytest.approx(float(ref.max()), abs=1e-5)
    assert [m["seq"] for m in msgs] == list(range(1, len(msgs) + 1))
    assert [m["audio_ms"] for m in msgs] == sorted(m["audio_ms"] for m in msgs)
    assert rss["end"] - rss["warm"] < RSS_GROWTH
