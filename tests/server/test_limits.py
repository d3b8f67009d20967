"""Idle eviction (message, close code, metric), backpressure through the socket and its 1013
limit, lag reporting, server-wide admission (429/1013 + Retry-After) and keepalive pings
(real uvicorn + `websockets`; a paused `FaultyEngine` holds batches back)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import httpx
import numpy as np
import pytest
import websockets

from tests.conftest import LM_NAME, SPEECH_NAME
from tests.server.conftest import LiveServer, make_settings
from tests.server.faults import install
from tests.server.waits import eventually
from tests.server.wshelp import (
    TEXT,
    recv_json,
    s16,
    send_json,
    speech_solo,
    speech_start,
    until_final,
)

CHUNK = 3200  # 100 ms


def audio(seconds: float, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return s16((0.2 * rng.standard_normal(int(16000 * seconds))).astype(np.float32))


def metric(http: str, prefix: str) -> float:
    for line in httpx.get(http + "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def test_idle_eviction_tells_the_client_on_both_endpoints(models_dir):
    with LiveServer(make_settings(models_dir, idle_timeout_s=0.5)) as srv:

        async def main():
            out = []
            ws, _ = await speech_start(srv.ws)
            out.append((await recv_json(ws), ws))
            ws = await websockets.connect(srv.ws + TEXT)
            await send_json(ws, {"type": "start"})
            await recv_json(ws)
            out.append((await recv_json(ws), ws))
            for _, w in out:
                await asyncio.wait_for(w.wait_closed(), 10)
            return [(m, w.close_code) for m, w in out]

        res = asyncio.run(main())
        for msg, code in res:
            assert msg["type"] == "error" and msg["code"] == "idle_timeout" and msg["message"]
            assert code == 1008
        for model in (SPEECH_NAME, LM_NAME):
            key = f'dlr_evictions_total{{model="{model}",reason="idle_timeout"}}'
            assert metric(srv.http, key) == 1.0
        assert srv.app.state.dlr.sessions == 0  # an eviction is not kept for resume


def test_messages_slower_than_the_idle_timeout_in_total_but_each_in_time_keep_it_open(models_dir):
    """The idle watchdog (one timer per connection) measures from the receive in progress:
    a message every 0.25 s keeps a 0.4 s idle timeout from firing for 1.5 s; then silence
    closes it within about one timeout."""
    with LiveServer(make_settings(models_dir, idle_timeout_s=0.4)) as srv:

        async def main():
            ws, _ = await speech_start(srv.ws, interim_results=False)
            for _ in range(6):
                await asyncio.sleep(0.25)
                await ws.send(b"\0\0" * 160)
            t0 = time.monotonic()
            while (m := await recv_json(ws, timeout=10))["type"] != "error":
                pass
            return m, time.monotonic() - t0

        msg, waited = asyncio.run(main())
    assert msg["code"] == "idle_timeout"
    assert 0.25 <= waited < 2.0, waited


def test_backpressure_slows_then_closes_with_1013(models_dir):
    settings = make_settings(
        models_dir, backpressure_audio_s=0.5, backpressure_timeout_s=1.0, max_batch_wait_ms=0
    )
    with LiveServer(settings) as srv:
        sched = srv.app.state.dlr.models[SPEECH_NAME].scheduler
        faults = install(sched)
        data = audio(3.0, 1)

        async def main():
            solo = await speech_solo(srv.ws, data, CHUNK)
            # held back for less than the timeout: slowed, then it completes unchanged
            ws, _ = await speech_start(srv.ws, interim_results=False)
            sched.max_chunk_frames = 1  # what a paused engine holds is one 10 ms frame
            faults.pause()
            for i in range(0, len(data), CHUNK):
                await ws.send(data[i : i + CHUNK])
            await asyncio.sleep(0.5)
            held = [s.received / 16000 for s in sched.streams()]
            faults.resume()
            sched.max_chunk_frames = 64
            await send_json(ws, {"type": "end"})
            final = await until_final(ws, [])
            await ws.close()
            # held back longer than the timeout: told and closed
            ws, _ = await speech_start(srv.ws, interim_results=False)
            faults.pause()
            t0 = time.monotonic()
            for i in range(0, len(data), CHUNK):
                await ws.send(data[i : i + CHUNK])
            err = await recv_json(ws, timeout=10)
            waited = time.monotonic() - t0
            await asyncio.wait_for(ws.wait_closed(), 10)
            faults.resume()
            return solo, held, final, err, waited, ws.close_code

        solo, held, final, err, waited, code = asyncio.run(main())
        assert len(held) == 1 and held[0] <= 0.5 + 0.1 + 1e-9  # reading stopped past 0.5 s
        assert final["label"] == solo["label"] and final["audio_ms"] == solo["audio_ms"]
        assert final["score"] == pytest.approx(solo["score"], abs=2e-6)
        assert err["code"] == "queue_full" and "real-time" in err["message"]
        assert code == 1013 and 0.9 <= waited < 5
        assert (
            metric(srv.http, f'dlr_evictions_total{{model="{SPEECH_NAME}",reason="queue_full"}}')
            == 1
        )


def test_lag_is_reported_in_partials_and_metrics(models_dir):
    with LiveServer(make_settings(models_dir)) as srv:
        sched = srv.app.state.dlr.models[SPEECH_NAME].scheduler

        async def main():
            ws, _ = await speech_start(srv.ws)
            sched.max_chunk_frames = 1  # 10 ms per batch: the 1 s frame is worked off slowly
            await ws.send(audio(1.0, 2))
            seen = [await recv_json(ws)]
            while seen[-1]["lag_ms"] > 0:
                seen.append(await recv_json(ws))
            await send_json(ws, {"type": "end"})
            final = await until_final(ws, seen)
            await ws.close()
            sched.max_chunk_frames = 64
            return seen, final

        seen, final = asyncio.run(main())
        assert seen[0]["lag_ms"] > 500  # most of the second was still waiting
        assert all(p["lag_ms"] + p["audio_ms"] == pytest.approx(1000, abs=0.2) for p in seen)
        assert [p["lag_ms"] for p in seen] == sorted((p["lag_ms"] for p in seen), reverse=True)
        assert final["lag_ms"] == 0
        assert metric(srv.http, f'dlr_speech_lag_seconds_count{{model="{SPEECH_NAME}"}}') > 10


def test_server_wide_queue_limit_refuses_new_work_only(models_dir):
    settings = make_settings(models_dir, max_total_queued_audio_s=1.0, retry_after_s=3)
    with LiveServer(settings) as srv:
        sched = srv.app.state.dlr.models[SPEECH_NAME].scheduler
        faults = install(sched)
        data = audio(1.5, 3)

        async def main():
            ws, _ = await speech_start(srv.ws, interim_results=False)
            sched.max_chunk_frames = 1  # a paused engine holds one frame, the rest queues
            faults.pause()
            await ws.send(data)
            await eventually(lambda: sched.queued_audio_s() > 1.0, timeout=10)
            ws2 = await websockets.connect(srv.ws + "/v1/speech/stream")
            with contextlib.suppress(websockets.ConnectionClosed):  # refused at the handshake
                await send_json(ws2, {"type": "start", "sample_rate": 16000})
            refused = await recv_json(ws2)
            await asyncio.wait_for(ws2.wait_closed(), 10)
            async with httpx.AsyncClient() as h:
                gen = await h.post(
                    srv.http + "/v1/generate", json={"prompt": "a", "max_new_tokens": 1}
                )
            faults.resume()
            sched.max_chunk_frames = 64
            t0 = time.monotonic()
            await send_json(ws, {"type": "end"})
            final = await until_final(ws, [])
            latency = time.monotonic() - t0
            await ws.close()
            ws3 = await websockets.connect(srv.ws + "/v1/speech/stream")
            await send_json(ws3, {"type": "start", "sample_rate": 16000})
            admitted = await recv_json(ws3)  # the queue is empty again
            await ws3.close()
            return refused, ws2.close_code, gen, final, latency, admitted

        refused, code, gen, final, latency, admitted = asyncio.run(main())
        assert admitted["type"] == "ready", admitted
        assert refused["code"] == "overloaded" and "max_total_queued_audio_s" in refused["message"]
        assert refused["retry_after_s"] == 3 and code == 1013
        assert gen.status_code == 429 and gen.headers["Retry-After"] == "3"
        assert gen.json()["error"]["code"] == "overloaded"
        assert final["audio_ms"] == 1500 and latency < 5  # the admitted session is served


def test_keepalive_pings_keep_idle_clients_and_cut_dead_ones(models_dir):
    settings = make_settings(models_dir, ws_ping_interval_s=0.2, ws_ping_timeout_s=0.5)
    with LiveServer(settings) as srv:

        async def alive():
            ws, _ = await speech_start(srv.ws, interim_results=False)
            await asyncio.sleep(2.0)  # silent, but the client library answers pings
            await ws.send(audio(0.3, 4))
            await send_json(ws, {"type": "end"})
            final = await until_final(ws, [])
            await ws.close()
            return final

        assert asyncio.run(alive())["audio_ms"] == 300
        # a peer that never answers pings (a raw socket that stops reading) is closed
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(
                b"GET /v1/speech/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            assert b"101" in s.recv(4096).split(b"\r\n")[0]
            t0 = time.monotonic()
            data = b""
            while time.monotonic() - t0 < 5:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            assert time.monotonic() - t0 < 4  # closed after ~interval + timeout
            assert b"\x89" in data  # a ping frame came first
