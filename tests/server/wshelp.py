"""Async WebSocket helpers for the resume, drain, fuzz and soak tests (real `websockets`)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import websockets

SPEECH = "/v1/speech/stream"
TEXT = "/v1/generate/stream"


def s16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


async def recv_json(ws, timeout: float = 30.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def send_json(ws, obj: dict) -> None:
    await ws.send(json.dumps(obj))


def drop(ws) -> None:
    """Kill the link without a close handshake (what a crashed client or network does)."""
    ws.transport.abort()


async def speech_start(url: str, **start) -> tuple[object, dict]:
    ws = await websockets.connect(url + SPEECH, max_size=None)
    await send_json(ws, {"type": "start", "sample_rate": 16000, "encoding": "pcm_s16le", **start})
    ready = await recv_json(ws)
    assert ready["type"] == "ready" and ready["resume_token"], ready
    return ws, ready


async def resume(
    url: str, path: str, ready: dict, last_seq: int | None = None
) -> tuple[object, dict]:
    ws = await websockets.connect(url + path, max_size=None)
    msg = {
        "type": "resume",
        "session_id": ready["session_id"],
        "resume_token": ready["resume_token"],
    }
    if last_seq is not None:
        msg["last_seq"] = last_seq
    await send_json(ws, msg)
    again = await recv_json(ws)
    assert again["type"] == "ready" and again["resumed"] is True, again
    return ws, again


async def until_final(ws, seen: list[dict]) -> dict:
    """Read partials (appended to `seen`) until the final, which is returned (and appended)."""
    while True:
        m = await recv_json(ws)
        assert m["type"] in ("partial", "final"), m
        seen.append(m)
        if m["type"] == "final":
            return m


async def speech_solo(url: str, data: bytes, chunk: int) -> dict:
    """The uninterrupted run: the whole clip, then end; returns the final."""
    ws, _ = await speech_start(url, interim_results=False)
    for i in range(0, len(data), chunk):
        await ws.send(data[i : i + chunk])
    await send_json(ws, {"type": "end"})
    final = await until_final(ws, [])
    await ws.close()
    return final


async def text_turn(ws, append: str, gen: dict, seen: list[dict] | None = None) -> tuple[str, dict]:
    if append:
        await send_json(ws, {"type": "append", "text": append})
    await send_json(ws, {"type": "generate", **gen})
    return await text_collect(ws, seen)


async def text_collect(ws, seen: list[dict] | None = None) -> tuple[str, dict]:
    out = []
    while True:
        m = await recv_json(ws)
        if seen is not None:
            seen.append(m)
        if m["type"] == "done":
            return "".join(out), m
        assert m["type"] == "token", m
        out.append(m["text"])


async def text_start(url: str) -> tuple[object, dict]:
    ws = await websockets.connect(url + TEXT)
    await send_json(ws, {"type": "start"})
    ready = await recv_json(ws)
    assert ready["type"] == "ready" and ready["resume_token"], ready
    return ws, ready
