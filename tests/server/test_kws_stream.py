"""Continuous mode of `WS /v1/speech/stream` over a real uvicorn server (`websockets` client).

A tiny random SC12-style model (log-mel front end, exponential-window head, a "detection"
operating point in its metadata) and voiced test signals (sawtooth "words" of different pitch
between quiet gaps): which command fires is the random model's, so these tests check the
protocol's properties against the runtime itself, not recognition (the shipped-model tests
do that): detections equal the offline rule on the same audio, the chunking does not matter,
thresholds and subsets change what fires, a resumed stream loses and repeats nothing, export
and import continue, bad options are refused with 1008, utterance mode is unchanged.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import torch
import websockets

from dlr_runtime import load_checkpoint, load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from dlr_runtime.kws import KeywordSpotter, KWSConfig
from dlr_runtime.listen import Listener, feed_listening
from tests.kws_audio import DETECTION, LABELS, NAME, RATE, words, write_kws_model
from tests.server.conftest import LiveServer, make_settings
from tests.server.waits import eventually
from tests.server.wshelp import SPEECH, drop, recv_json, resume, s16, send_json, speech_start


@pytest.fixture(scope="module")
def kws_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("kws-models")
    write_kws_model(root)
    return root


@pytest.fixture(scope="module")
def srv(kws_dir):
    with LiveServer(make_settings(kws_dir, resume_grace_s=20.0, max_chunk_frames=64)) as s:
        yield s


def offline(kws_dir, x: np.ndarray, **opts) -> list[tuple[str, float]]:
    """The runtime's detections of the same audio (no server): (label, end_ms)."""
    rec = load_recurrent(kws_dir / NAME)
    eng = Engine(make_backend(rec, "torch"), NAME, 1)
    cfg = KWSConfig.from_dict({**DETECTION, **opts})
    lis, slot = Listener(LABELS, 160, RATE, cfg), eng.open()
    q = np.round(np.clip(x, -1, 1) * 32767) / 32768  # what the server decodes from pcm_s16le
    x16 = (np.clip(x, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768.0
    assert np.abs(q - x16).max() < 1e-4
    feed_listening(eng, [slot], [lis], [torch.from_numpy(x16)])
    return [(d.label, d.end_ms) for d in lis.detections]


async def stream(url: str, data: bytes, chunk: int, **start) -> tuple[list[dict], dict]:
    """Send `data` in `chunk`-byte messages, end; returns (every message, the final)."""
    ws, ready = await speech_start(url, mode="continuous", **start)
    assert ready["mode"] == "continuous"
    seen: list[dict] = []

    async def reader():
        while True:
            m = await recv_json(ws)
            seen.append(m)
            if m["type"] in ("final", "error"):
                return m

    task = asyncio.create_task(reader())
    for i in range(0, len(data), chunk):
        await ws.send(data[i : i + chunk])
    await send_json(ws, {"type": "end"})
    final = await asyncio.wait_for(task, 60)
    await ws.close()
    return seen, final


def dets(seen: list[dict]) -> list[tuple[str, float]]:
    return [(m["label"], m["end_ms"]) for m in seen if m["type"] == "detection"]


def test_detections_match_runtime_and_chunking_does_not_matter(srv, kws_dir):
    x = words()
    data = s16(x)
    want = offline(kws_dir, x)
    assert len(want) >= 2, "the test model should fire on several words"
    runs = {}
    for ms in (20, 100, 1000):
        seen, final = asyncio.run(stream(srv.ws, data, 32 * ms, interim_results=True))
        assert final["type"] == "final", final
        got = dets(seen)
        assert got == want, (ms, got, want)
        # detections are numbered messages, in order, with sane times, listed by the final
        d = [m for m in seen if m["type"] == "detection"]
        assert [m["index"] for m in d] == list(range(1, len(d) + 1))
        seqs = [m["seq"] for m in seen]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        for m in d:
            assert 0 <= m["start_ms"] <= m["end_ms"] <= len(x) / RATE * 1000
            assert DETECTION["threshold"] <= m["score"] <= 1
        assert [(m["label"], m["end_ms"]) for m in final["detections"]] == want
        partials = [m for m in seen if m["type"] == "partial"]
        assert partials and {m["vad"] for m in partials} == {"speech", "silence"}
        assert all(m["label"] == "_silence_" for m in partials if m["vad"] == "silence")
        runs[ms] = got
    assert runs[20] == runs[100] == runs[1000]
    metrics = httpx.get(srv.http + "/metrics", timeout=10).text
    for line in ('decision="computed"', 'decision="skipped"', "dlr_kws_detections_total{"):
        assert line in metrics


def test_overlapping_windows_stream_exactly(tmp_path_factory):
    """A model whose frames see the samples before them (history in the state, reset with the
    state when the voice gate opens): the server's detections equal the runtime's for any
    chunking, and a resumed stream continues them."""
    root = tmp_path_factory.mktemp("kws-window")
    write_kws_model(root, frame_window=320)
    x = words()
    data = s16(x)
    want = offline(root, x)
    assert len(want) >= 2, "the test model should fire on several words"
    # without the gate, every frame is computed: the model's own offline forward (windows cut
    # from the whole signal at once) is an independent reference for the streamed framing
    x16 = torch.from_numpy((np.clip(x, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768)
    model = load_checkpoint(root / NAME).eval()
    with torch.no_grad():
        scores = model(x16[None])[0].double().numpy()  # (frames, C)
    spotter = KeywordSpotter(LABELS, 10.0, KWSConfig.from_dict(DETECTION))
    ungated = [(d.label, d.end_ms, d.score) for d in spotter.run(scores)]
    assert ungated
    with LiveServer(make_settings(root, resume_grace_s=20.0)) as s:
        (info,) = httpx.get(s.http + "/v1/models", timeout=10).json()["data"]
        assert (info["frame_stride"], info["frame_window"]) == (160, 320)
        for ms in (20, 1000):
            seen, final = asyncio.run(stream(s.ws, data, 32 * ms))
            assert final["type"] == "final", final
            assert dets(seen) == want, ms
            seen, _ = asyncio.run(stream(s.ws, data, 32 * ms + 6, vad=False))
            got = [(m["label"], m["end_ms"], m["score"]) for m in seen if m["type"] == "detection"]
            assert [g[:2] for g in got] == [u[:2] for u in ungated], ms
            # scores travel rounded to 1e-6; observed 7e-7 apart. A history one sample off
            # moves them by 4e-5 or more.
            assert np.allclose([g[2] for g in got], [u[2] for u in ungated], atol=1e-5), ms
        cut = len(data) // 2 // 320 * 320 + 106  # 53 samples into a 160-sample frame
        seen = asyncio.run(dropped_and_resumed(s, data, cut, interim_results=False))
        assert dets(seen) == want
        assert [m["seq"] for m in seen] == list(range(1, len(seen) + 1))


@pytest.mark.parametrize(
    "variant",
    [{"frontend": "speech_embedding"}, {"unknown_classes": 9}],
    ids=["embedding", "union"],
)
def test_other_model_kinds_stream_exactly(tmp_path_factory, variant):
    """A model with the frozen speech-embedding front end (80 ms frames, each from its 0.78 s
    window, kept as history in the state), and one whose `_unknown_` is the union of nine
    classes: ungated, the server's detections equal the model's offline forward through the
    same rule, for chunks that do not align with its frames."""
    root = tmp_path_factory.mktemp("kws-variant")
    write_kws_model(root, **variant)
    frame_ms = 80.0 if "frontend" in variant else 10.0
    x = words()
    data = s16(x)
    x16 = torch.from_numpy((np.clip(x, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768)
    model = load_checkpoint(root / NAME).eval()
    with torch.no_grad():
        scores = model(x16[None])[0].double().numpy()  # (frames, C), the whole-stream pass
    spotter = KeywordSpotter(LABELS, frame_ms, KWSConfig.from_dict(DETECTION))
    ungated = [(d.label, d.end_ms, d.score) for d in spotter.run(scores)]
    assert ungated, "the test model should fire"
    with LiveServer(make_settings(root)) as s:
        (info,) = httpx.get(s.http + "/v1/models", timeout=10).json()["data"]
        assert info["labels"] == LABELS
        if "frontend" in variant:
            assert (info["frame_stride"], info["frame_window"]) == (1280, 12512)
        for ms in (20, 1000):
            seen, final = asyncio.run(stream(s.ws, data, 32 * ms + 6, vad=False))
            assert final["type"] == "final", final
            got = [(m["label"], m["end_ms"], m["score"]) for m in seen if m["type"] == "detection"]
            assert [g[:2] for g in got] == [u[:2] for u in ungated], ms
            assert np.allclose([g[2] for g in got], [u[2] for u in ungated], atol=1e-4), ms


async def dropped_and_resumed(srv: LiveServer, data: bytes, cut: int, **start) -> list[dict]:
    """Send data[:cut], wait for a detection, drop the socket, resume, send the rest: every
    message of both connections, up to the final."""
    ws, ready = await speech_start(srv.ws, mode="continuous", **start)
    for i in range(0, cut, 3200):
        await ws.send(data[i : min(i + 3200, cut)])
    seen = []
    while not any(m["type"] == "detection" for m in seen):  # at least one before the drop
        seen.append(await recv_json(ws))
    drop(ws)
    sess = srv.app.state.sessions.live[ready["session_id"]]
    await eventually(lambda: sess.detached_since is not None)
    ws2, again = await resume(srv.ws, SPEECH, ready, last_seq=seen[-1]["seq"])
    assert again["bytes_received"] == cut
    for i in range(cut, len(data), 3200):
        await ws2.send(data[i : i + 3200])
    await send_json(ws2, {"type": "end"})
    while seen[-1]["type"] != "final":
        seen.append(await recv_json(ws2))
    await ws2.close()
    return seen


def test_thresholds_and_subsets_change_what_fires(srv, kws_dir):
    data = s16(words())
    base = dets(asyncio.run(stream(srv.ws, data, 3200))[0])
    labels = [lab for lab, _ in base]
    high = dets(asyncio.run(stream(srv.ws, data, 3200, threshold=0.99))[0])
    assert len(high) < len(base)
    first = labels[0]
    only = dets(asyncio.run(stream(srv.ws, data, 3200, listen=[first]))[0])
    assert only and {lab for lab, _ in only} == {first}
    assert only == offline(kws_dir, words(), listen=[first])
    strict = dets(asyncio.run(stream(srv.ws, data, 3200, keywords={first: 0.999}))[0])
    assert first not in {lab for lab, _ in strict} or len(strict) < len(base)
    assert strict == offline(kws_dir, words(), keywords={first: 0.999})
    slow = dets(asyncio.run(stream(srv.ws, data, 3200, refractory_ms=60000))[0])
    assert len(slow) == 1


async def rest_until_final(ws, seen: list[dict]) -> dict:
    """Every message (detections too) into `seen` until the final, which is returned."""
    while (m := await recv_json(ws, timeout=60))["type"] != "final":
        seen.append(m)
    return m


async def configured_stream(
    url: str, data: bytes, at: int, change: dict, **start
) -> tuple[list, dict]:
    """Send data[:at], a `configure` with `change`, the rest, end: (messages, configured)."""
    ws, _ = await speech_start(url, mode="continuous", **start)
    seen: list[dict] = []
    for i in range(0, at, 3200):
        await ws.send(data[i : min(i + 3200, at)])
    sent_ms = at / 2 / RATE * 1000
    while at and not (
        (m := await recv_json(ws))["type"] == "partial" and m["audio_ms"] >= sent_ms - 20
    ):
        seen.append(m)  # (until the server has processed what was sent)
    await send_json(ws, {"type": "configure", **change})
    while (m := await recv_json(ws))["type"] != "configured":
        seen.append(m)
    conf = m
    for i in range(at, len(data), 3200):
        await ws.send(data[i : i + 3200])
    await send_json(ws, {"type": "end"})
    m = await rest_until_final(ws, seen)
    await ws.close()
    assert [(d["label"], d["end_ms"]) for d in m["detections"]] == dets(seen)
    return seen, conf


def test_configure_changes_the_options_from_where_it_applies(srv, kws_dir):
    x = words()
    data = s16(x)
    base = offline(kws_dir, x)
    # a threshold no smoothed posterior reaches, from half-way: what fired before stays
    seen, conf = asyncio.run(configured_stream(srv.ws, data, len(data) // 2, {"threshold": 1.0}))
    assert conf["detection"]["threshold"] == 1.0 and conf["audio_ms"] >= len(x) / RATE * 500 - 20
    assert dets(seen) == [d for d in base if d[1] <= conf["audio_ms"]]
    assert len(dets(seen)) < len(base)
    # listening for one command from the first byte == a stream started with that subset
    first = base[0][0]
    seen, conf = asyncio.run(configured_stream(srv.ws, data, 0, {"listen": [first]}))
    assert conf["audio_ms"] == 0 and conf["detection"]["listen"] == [first]
    assert dets(seen) == offline(kws_dir, x, listen=[first])
    # a new shared threshold keeps the session's own per-command one
    own = {first: 0.999}
    seen, conf = asyncio.run(configured_stream(srv.ws, data, 0, {"threshold": 0.3}, keywords=own))
    assert conf["detection"]["keywords"] == own and conf["detection"]["threshold"] == 0.3
    assert dets(seen) == offline(kws_dir, x, keywords=own)


@pytest.mark.parametrize(
    "start,change,needle",
    [
        ({"mode": "continuous"}, {"keywords": {"banana": 0.5}}, "banana"),
        ({"mode": "continuous"}, {"threshold": 0}, "threshold"),
        ({"mode": "continuous"}, {}, "configure needs one of"),
        ({"mode": "continuous"}, {"keywords": None}, "configure needs one of"),
        ({"mode": "continuous"}, {"vad": False}, "vad"),
        ({}, {"threshold": 0.5}, "continuous"),
    ],
)
def test_bad_configure_errors_and_closes_1008(srv, start, change, needle):
    async def main():
        ws = await websockets.connect(srv.ws + SPEECH)
        await send_json(ws, {"type": "start", "sample_rate": RATE, **start})
        assert (await recv_json(ws))["type"] == "ready"
        await ws.send(s16(words())[:6400])
        await send_json(ws, {"type": "configure", **change})
        while (msg := await recv_json(ws))["type"] == "partial":
            pass
        assert msg["type"] == "error" and msg["code"] == "invalid_message", msg
        assert needle in msg["message"], msg
        with pytest.raises(websockets.ConnectionClosed) as e:
            await recv_json(ws)
        assert e.value.rcvd.code == 1008

    asyncio.run(main())


def test_no_gate_computes_every_frame_and_still_matches(srv, kws_dir):
    data = s16(words())
    seen, final = asyncio.run(stream(srv.ws, data, 3200, vad=False))
    assert all(m["vad"] == "speech" for m in seen if m["type"] == "partial")
    assert final["type"] == "final"


@pytest.mark.parametrize(
    "opts,needle",
    [
        ({"mode": "continuous", "keywords": {"banana": 0.5}}, "banana"),
        ({"mode": "continuous", "listen": ["yes", "_silence_"]}, "_silence_"),
        ({"mode": "continuous", "threshold": 1.5}, "threshold"),
        ({"mode": "continuous", "refractory_ms": -1}, "refractory_ms"),
        ({"threshold": 0.5}, "continuous"),
        ({"mode": "sometimes"}, "mode"),
        ({"mode": "continuous", "keywords": {"yes": 0}}, "keywords"),
    ],
)
def test_bad_options_error_and_close_1008(srv, opts, needle):
    async def main():
        ws = await websockets.connect(srv.ws + SPEECH)
        await send_json(ws, {"type": "start", "sample_rate": RATE, **opts})
        msg = await recv_json(ws)
        assert msg["type"] == "error" and msg["code"] == "invalid_message", msg
        assert needle in msg["message"], msg
        with pytest.raises(websockets.ConnectionClosed) as e:
            await recv_json(ws)
        assert e.value.rcvd.code == 1008
        # nothing left behind (the refused session's slot is given back as it finishes)
        pool = srv.app.state.dlr.models[NAME].engine.pool
        assert await eventually(lambda: pool.in_use == 0, timeout=10)

    asyncio.run(main())


def test_resume_mid_stream_loses_and_repeats_nothing(srv):
    data = s16(words())
    want = dets(asyncio.run(stream(srv.ws, data, 3200))[0])

    seen = asyncio.run(dropped_and_resumed(srv, data, len(data) // 2 // 3200 * 3200))
    assert dets(seen) == want
    seqs = [m["seq"] for m in seen]
    assert seqs == list(range(1, len(seqs) + 1))  # nothing lost, nothing twice
    assert [m["index"] for m in seen if m["type"] == "detection"] == list(range(1, len(want) + 1))


def test_export_import_continues_detections(srv):
    """Export mid-stream, import as a new session, finish there: the detections before and
    after the export are the uninterrupted stream's, numbered on without a repeat."""
    data = s16(words())
    want = dets(asyncio.run(stream(srv.ws, data, 3200))[0])

    async def main():
        ws, ready = await speech_start(srv.ws, mode="continuous", interim_results=False)
        cut = len(data) // 2 // 3200 * 3200
        for i in range(0, cut, 3200):
            await ws.send(data[i : i + 3200])
        sess = srv.app.state.sessions.live[ready["session_id"]]
        sched = srv.app.state.dlr.models[NAME].scheduler
        await eventually(lambda: sess.consumed >= cut // 2 - 160 and sched.idle())
        await eventually(lambda: sess.n_detections == sess.stream.listener.n_detections)
        async with httpx.AsyncClient() as http:
            r = await http.get(
                f"{srv.http}/v1/sessions/{ready['session_id']}/state",
                headers={"X-Resume-Token": ready["resume_token"]},
            )
            assert r.status_code == 200, r.text
            moved = await http.post(f"{srv.http}/v1/sessions", content=r.content)
            assert moved.status_code == 201, moved.text
            moved = moved.json()
        before = []
        await ws.close()
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                before.append(await recv_json(ws, timeout=5))
        ws2, again = await resume(srv.ws, SPEECH, moved, last_seq=0)
        assert again["bytes_received"] == cut
        for i in range(cut, len(data), 3200):
            await ws2.send(data[i : i + 3200])
        await send_json(ws2, {"type": "end"})
        after = []
        while not after or after[-1]["type"] != "final":
            after.append(await recv_json(ws2))
        await ws2.close()
        return before, after

    before, after = asyncio.run(main())
    got = [m for m in before + after if m["type"] == "detection"]
    assert [(m["label"], m["end_ms"]) for m in got] == want
    assert [m["index"] for m in got] == list(range(1, len(want) + 1))
    assert dets(before) and dets(after)  # the cut falls between detections
    assert [(m["label"], m["end_ms"]) for m in after[-1]["detections"]] == want


def test_utterance_mode_is_unchanged(srv):
    async def main():
        ws, ready = await speech_start(srv.ws)
        assert "mode" not in ready
        await ws.send(s16(words()[:16000]))
        await send_json(ws, {"type": "end"})
        while (m := await recv_json(ws))["type"] != "final":
            assert m["type"] == "partial" and "vad" not in m
        assert "detections" not in m and m["label"] in LABELS
        await ws.close()

    asyncio.run(main())


def test_drain_persists_and_a_restarted_server_continues(kws_dir, tmp_path):
    """Drain (the SIGTERM path) mid-stream with state_dir, restart on it, resume: the
    detections before and after equal the uninterrupted stream's, seq without a gap."""
    data = s16(words())
    settings = make_settings(kws_dir, state_dir=tmp_path / "state", resume_grace_s=30)
    a = LiveServer(settings).start()
    seen: list[dict] = []

    async def first():
        ws, ready = await speech_start(a.ws, mode="continuous")
        cut = len(data) // 2 // 3200 * 3200
        for i in range(0, cut, 3200):
            await ws.send(data[i : i + 3200])
        seen.append(await recv_json(ws))
        stopping = asyncio.create_task(asyncio.to_thread(a.stop))  # drains: persisted
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                seen.append(await recv_json(ws, timeout=30))
        await stopping
        return ready

    try:
        want = dets(asyncio.run(stream(a.ws, data, 3200))[0])
        ready = asyncio.run(first())
    finally:
        a.stop()
    assert seen[-1]["type"] == "going_away" and seen[-1]["resume"] is True
    assert list((tmp_path / "state").glob("*.state"))
    b = LiveServer(settings).start()

    async def second():
        last = max(m.get("seq", 0) for m in seen)
        ws2, again = await resume(b.ws, SPEECH, ready, last_seq=last)
        for i in range(again["bytes_received"], len(data), 3200):
            await ws2.send(data[i : i + 3200])
        await send_json(ws2, {"type": "end"})
        while seen[-1]["type"] != "final":
            seen.append(await recv_json(ws2))
        await ws2.close()

    try:
        asyncio.run(second())
    finally:
        b.stop()
    numbered = [m for m in seen if "seq" in m]
    assert [m["seq"] for m in numbered] == list(range(1, len(numbered) + 1))
    assert dets(seen) == want


def test_configured_options_survive_a_resume(srv, kws_dir):
    x = words()
    data = s16(x)
    first = offline(kws_dir, x)[0][0]

    async def main():
        ws, ready = await speech_start(srv.ws, mode="continuous", interim_results=False)
        await send_json(ws, {"type": "configure", "listen": [first]})
        conf = await recv_json(ws)
        assert conf["type"] == "configured" and conf["detection"]["listen"] == [first]
        cut = len(data) // 2 // 3200 * 3200
        for i in range(0, cut, 3200):
            await ws.send(data[i : i + 3200])
        drop(ws)
        sess = srv.app.state.sessions.live[ready["session_id"]]
        await eventually(lambda: sess.detached_since is not None)
        ws2, again = await resume(srv.ws, SPEECH, ready, last_seq=conf["seq"])
        assert again["detection"]["listen"] == [first]  # the operating point in force
        for i in range(again["bytes_received"], len(data), 3200):
            await ws2.send(data[i : i + 3200])
        await send_json(ws2, {"type": "end"})
        final = await rest_until_final(ws2, [])
        await ws2.close()
        return final

    final = asyncio.run(main())
    got = [(d["label"], d["end_ms"]) for d in final["detections"]]
    assert got == offline(kws_dir, x, listen=[first])


def test_an_idle_continuous_stream_parks_and_continues_exactly(kws_dir):
    """Parking seals the listener (gate, detector, detections) with the state: a continuous
    stream parked half-way, then fed the rest, detects exactly what the runtime does."""
    x = words()
    data = s16(x)
    want = offline(kws_dir, x)
    settings = make_settings(kws_dir, park_after_idle_s=0.3, max_chunk_frames=64)
    with LiveServer(settings) as srv:

        async def main():
            ws, ready = await speech_start(srv.ws, mode="continuous", interim_results=False)
            cut = len(data) // 2 // 3200 * 3200
            for i in range(0, cut, 3200):
                await ws.send(data[i : i + 3200])
            sess = srv.app.state.sessions.live[ready["session_id"]]
            await eventually(lambda: sess.parked, timeout=10)
            for i in range(cut, len(data), 3200):  # the next frame brings it back
                await ws.send(data[i : i + 3200])
            await send_json(ws, {"type": "end"})
            seen: list[dict] = []
            final = await rest_until_final(ws, seen)
            await ws.close()
            return seen, final

        seen, final = asyncio.run(main())
        parked = srv.app.state.dlr.metrics.evictions.labels(NAME, "parked_idle")._value.get()
    assert parked >= 1
    assert dets(seen) == want
    assert [(d["label"], d["end_ms"]) for d in final["detections"]] == want
    assert [m["index"] for m in seen if m["type"] == "detection"] == list(range(1, len(want) + 1))
