"""WS /v1/speech/stream: message flow and error paths (TestClient), concurrency equal to solo
runs and resampled input (real uvicorn + `websockets`)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
import torchaudio
import websockets
from fastapi.testclient import TestClient

from dlr_runtime import load_recurrent
from server.app import create_app
from tests.conftest import SPEECH_NAME
from tests.server.conftest import expect_error, make_settings, play_until_error
from tests.server.faults import install

speech_synth = pytest.importorskip("training.data.speech_synth")

WORDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
SCORE_TOL = 2e-6  # reported probabilities (rounded to 1e-6) of shared-batch vs solo runs


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    """Spoken words at 16 kHz (espeak-ng), one per label."""
    return {w: speech_synth.synthesize_word(w, "en-us", 160, 50) for w in WORDS}


def s16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def f32(x: np.ndarray) -> bytes:
    return np.asarray(x, dtype="<f4").tobytes()


def receive_until_final(ws) -> tuple[list[dict], dict]:
    partials = []
    while True:
        m = ws.receive_json()
        if m["type"] == "final":
            return partials, m
        assert m["type"] == "partial", m
        partials.append(m)


# ---------------------------------------------------------------- protocol (TestClient)
def test_flow_partials_final_and_restart(client, clips, models_dir):
    x = clips["yes"]
    with client.websocket_connect("/v1/speech/stream") as ws:
        ws.send_json({"type": "start", "sample_rate": 16000, "encoding": "pcm_f32le"})
        ready = ws.receive_json()
        assert ready["type"] == "ready" and ready["model"] == SPEECH_NAME
        assert ready["labels"] == WORDS and len(ready["session_id"]) == 32
        for i in range(0, len(x), 1600):
            ws.send_bytes(f32(x[i : i + 1600]))
        first = ws.receive_json()  # interim results are on by default
        assert first["type"] == "partial" and first["audio_ms"] > 0
        ws.send_json({"type": "end"})
        partials, final = receive_until_final(ws)
        partials.insert(0, first)
        assert all(p["audio_ms"] <= final["audio_ms"] for p in partials)
        assert final["audio_ms"] == pytest.approx(len(x) / 16)
        assert set(final) == {"type", "audio_ms", "lag_ms", "label", "score", "top", "seq"}
        assert final["lag_ms"] == 0.0  # everything received was processed
        seqs = [p["seq"] for p in partials] + [final["seq"]]
        assert seqs == list(range(1, len(seqs) + 1))  # numbered, none lost or repeated
        assert final["label"] == final["top"][0]["label"] and len(final["top"]) == 5
        # the final equals the recurrent model over the whole clip in one call
        rec = load_recurrent(models_dir / SPEECH_NAME)
        _, state = rec.chunk(torch.from_numpy(x).unsqueeze(0), rec.init_state(1))
        probs = torch.softmax(rec.scores(state)[0].double(), -1)
        assert final["score"] == pytest.approx(float(probs.max()), abs=1e-5)
        assert final["label"] == WORDS[int(probs.argmax())]
        # a second start on the same connection is a fresh session
        ws.send_json({"type": "start", "sample_rate": 16000, "interim_results": False})
        ready2 = ws.receive_json()
        assert ready2["session_id"] != ready["session_id"]
        ws.send_bytes(s16(x))
        ws.send_json({"type": "end"})
        partials2, final2 = receive_until_final(ws)
        assert partials2 == []
        assert final2["label"] == final["label"]
        assert final2["score"] == pytest.approx(final["score"], abs=1e-3)  # int16 rounding


START = {"type": "start", "sample_rate": 16000, "encoding": "pcm_s16le"}


@pytest.mark.parametrize(
    "messages,code,close",
    [
        (["not json"], "invalid_json", 1003),
        ([{"type": "bogus"}], "invalid_message", 1008),
        ([{"type": "start", "sample_rate": "fast"}], "invalid_message", 1008),
        ([{"type": "start", "sample_rate": 10**9}], "invalid_message", 1008),
        ([{"type": "start", "sample_rate": 16000, "encoding": "mp3"}], "invalid_message", 1008),
        ([b"\x00\x01"], "no_session", 1008),
        ([{"type": "end"}], "no_session", 1008),
        ([{**START, "model": "nope"}], "unknown_model", 1008),
        ([START, b"\x00\x01\x02"], "invalid_audio", 1003),
        (
            [{**START, "encoding": "pcm_f32le"}, np.array([np.nan], "<f4").tobytes()],
            "invalid_audio",
            1003,
        ),
        ([START, b"\x00" * (2 << 20)], "frame_too_big", 1009),
    ],
)
def test_error_paths(client, messages, code, close):
    def valid(m: dict) -> bool:
        return m.get("model") is None and code != "invalid_message"

    with client.websocket_connect("/v1/speech/stream") as ws:
        play_until_error(ws, messages, code, close, valid)


def test_overload_idle_and_queue_limits(models_dir):
    settings = make_settings(
        models_dir, max_sessions=1, idle_timeout_s=1.0, max_queued_audio_s=1.0, max_batch_wait_ms=0
    )
    with TestClient(create_app(settings)) as c:
        with c.websocket_connect("/v1/speech/stream") as ws1:
            ws1.send_json(START)
            assert ws1.receive_json()["type"] == "ready"
            with c.websocket_connect("/v1/speech/stream") as ws2:
                expect_error(ws2, "overloaded", 1013)
            expect_error(ws1, "idle_timeout", 1008)  # then nothing came for 1 s
        st = c.app.state.dlr
        sched = st.models[SPEECH_NAME].scheduler
        with c.websocket_connect("/v1/speech/stream") as ws:
            ws.send_json({**START, "interim_results": False})
            assert ws.receive_json()["type"] == "ready"
            sched.max_chunk_frames = 1  # slow consumer: at most 10 ms of audio per batch
            ws.send_bytes(b"\x00" * 2 * 40000)  # 2.5 s of audio at once
            expect_error(ws, "queue_full", 1013)
        text = c.get("/metrics").text
        assert f'dlr_evictions_total{{model="{SPEECH_NAME}",reason="idle_timeout"}} 1.0' in text
        assert f'dlr_evictions_total{{model="{SPEECH_NAME}",reason="queue_full"}} 1.0' in text
        assert c.get("/readyz").json()["sessions"] == 0


# ---------------------------------------------------------------- real server
async def run_stream(
    url: str, audio: np.ndarray, rate: int, chunk: int, pace_s: float = 0.0, interim: bool = True
) -> dict:
    async with websockets.connect(url + "/v1/speech/stream") as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "start",
                    "sample_rate": rate,
                    "encoding": "pcm_f32le",
                    "interim_results": interim,
                }
            )
        )
        assert json.loads(await ws.recv())["type"] == "ready"

        async def reader() -> tuple[int, dict]:
            n = 0
            while True:
                m = json.loads(await ws.recv())
                if m["type"] == "final":
                    return n, m
                assert m["type"] == "partial", m
                n += 1

        task = asyncio.create_task(reader())
        for i in range(0, len(audio), chunk):
            await ws.send(f32(audio[i : i + chunk]))
            if pace_s:
                await asyncio.sleep(pace_s)
        await ws.send(json.dumps({"type": "end"}))
        n, final = await task
        return {**final, "n_partials": n}


def batch_sizes(http: str, op: str) -> tuple[float, float]:
    import httpx

    text = httpx.get(http + "/metrics").text
    vals = {}
    for line in text.splitlines():
        for k in ("sum", "count"):
            if line.startswith(f"dlr_batch_size_{k}") and f'op="{op}"' in line:
                vals[k] = float(line.split()[-1])
    return vals["sum"], vals["count"]


def test_concurrent_streams_equal_solo(live, clips):
    """24 concurrent streams (different words, chunk sizes, rates) share batches and get the
    same finals as each stream alone."""
    rng = np.random.default_rng(0)
    jobs = []
    for i in range(24):
        w = WORDS[i % 10]
        rate = [16000, 8000, 48000][i % 3]
        x = torch.from_numpy(clips[w])
        audio = (
            x.numpy() if rate == 16000 else torchaudio.functional.resample(x, 16000, rate).numpy()
        )
        jobs.append((audio * (0.5 + rng.random()), rate, int(rng.integers(200, 3000))))

    async def main() -> tuple[list[dict], list[dict]]:
        solo = [await run_stream(live.ws, a, r, c) for a, r, c in jobs]
        s0, c0 = batch_sizes(live.http, "audio")
        together = await asyncio.gather(
            *[run_stream(live.ws, a, r, c, pace_s=0.005) for a, r, c in jobs]
        )
        s1, c1 = batch_sizes(live.http, "audio")
        assert (s1 - s0) / (c1 - c0) > 1.5, "concurrent streams were not batched together"
        return solo, together

    solo, together = asyncio.run(main())
    for a, b in zip(solo, together, strict=True):
        assert a["label"] == b["label"]
        assert a["audio_ms"] == b["audio_ms"]
        for ta, tb in zip(a["top"], b["top"], strict=True):
            assert ta["label"] == tb["label"] or abs(ta["score"] - tb["score"]) <= SCORE_TOL
            assert abs(ta["score"] - tb["score"]) <= SCORE_TOL


@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_resampled_input_classifies_like_16k(live, clips, rate):
    async def main():
        out = []
        for w in ("yes", "left", "stop"):
            x = torch.from_numpy(clips[w])
            ref = await run_stream(live.ws, clips[w], 16000, 1600, interim=False)
            y = torchaudio.functional.resample(x, 16000, rate).numpy()
            got = await run_stream(live.ws, y, rate, 997, interim=False)  # odd chunks
            out.append((ref, got))
        return out

    for ref, got in asyncio.run(main()):
        assert got["label"] == ref["label"]
        assert abs(got["audio_ms"] - ref["audio_ms"]) <= 1.0
        assert got["score"] == pytest.approx(ref["score"], abs=0.02)


def test_failed_batch_is_reported_with_1011_and_server_keeps_serving(client, clips):
    sched = client.app.state.dlr.models[SPEECH_NAME].scheduler
    with client.websocket_connect("/v1/speech/stream") as ws:
        ws.send_json({**START, "interim_results": True})
        assert ws.receive_json()["type"] == "ready"
        install(sched).fail_next = RuntimeError("injected")
        ws.send_bytes(s16(clips["go"]))
        expect_error(ws, "internal_error", 1011)
    with client.websocket_connect("/v1/speech/stream") as ws:
        ws.send_json({**START, "interim_results": False})
        assert ws.receive_json()["type"] == "ready"
        ws.send_bytes(s16(clips["go"]))
        ws.send_json({"type": "end"})
        assert ws.receive_json()["type"] == "final"
    assert client.get("/readyz").json()["sessions"] == 0
