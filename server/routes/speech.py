"""`WS /v1/speech/stream`: streaming speech-command classification.

Protocol: client `{"type":"start","sample_rate","encoding","model","interim_results"}` ->
server `{"type":"ready","session_id","model","labels"}`; then binary frames of mono PCM
(pcm_s16le or pcm_f32le) at the client's rate, resampled statefully to the model's rate; the
server sends `{"type":"partial","audio_ms","label","score","top"}` at most every
`partial_interval_ms`; client `{"type":"end"}` -> `{"type":"final",...}` (same fields). Another
`start` may follow on the same connection. Errors: `{"type":"error","code","message"}` + close.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import torch
from fastapi import APIRouter, WebSocket
from pydantic import TypeAdapter, ValidationError

from dlr_runtime.engine import PoolFullError, StreamResampler

from ..errors import validation_message
from ..protocol import SpeechMessage, SpeechStart
from ..registry import ModelEntry
from ..scheduler import SpeechStream
from ..state import NoModelError, get_state
from .wsutil import Closed, Conn

router = APIRouter()
_parse = TypeAdapter(SpeechMessage)
TOP_N = 5


def result(kind: str, labels: list[str], scores: torch.Tensor | None, audio_ms: float) -> dict:
    """A partial/final message from class scores (C,) (logits; reported as probabilities)."""
    msg: dict = {"type": kind, "audio_ms": round(audio_ms, 1)}
    if scores is None:
        return {**msg, "label": None, "score": None, "top": []}
    probs = torch.softmax(scores.double(), dim=-1)  # (C,)
    order = torch.argsort(probs, descending=True)[:TOP_N].tolist()
    top = [{"label": labels[i], "score": round(float(probs[i]), 6)} for i in order]
    return {**msg, "label": top[0]["label"], "score": top[0]["score"], "top": top}


def decode_pcm(data: bytes, encoding: str) -> np.ndarray:
    """PCM bytes -> float32 samples in [-1, 1]; ValueError for bad length or values."""
    width = 2 if encoding == "pcm_s16le" else 4
    if len(data) % width:
        raise ValueError(f"{encoding} frames must be a multiple of {width} bytes, got {len(data)}")
    if encoding == "pcm_s16le":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    x = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.isfinite(x).all():
        raise ValueError("pcm_f32le samples must be finite")
    return x


class SpeechSession:
    def __init__(
        self,
        conn: Conn,
        m: ModelEntry,
        start: SpeechStart,
        stream: SpeechStream,
        sid: str,
        t0: float,
    ) -> None:
        self.conn, self.m, self.start, self.stream = conn, m, start, stream
        self.sid, self.t0 = sid, t0
        cfg = m.engine.config
        self.rate = cfg.sample_rate
        self.labels = list(cfg.labels)
        self.resampler = StreamResampler(start.sample_rate, self.rate)
        self.sender: asyncio.Task | None = None
        if start.interim_results:
            self.sender = asyncio.get_running_loop().create_task(self._partials())

    def audio_ms(self) -> float:
        return self.stream.consumed / self.rate * 1000

    async def _partials(self) -> None:
        interval = self.conn.st.settings.partial_interval_ms / 1000
        last = 0.0
        s = self.stream
        while True:
            await s.progress.wait()
            wait = last + interval - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            s.progress.clear()
            if s.error is not None:  # its batch failed: tell the client now
                await self.conn.fail("internal_error", str(s.error))
                return
            if s.latest is not None:
                await self.conn.send(result("partial", self.labels, s.latest, self.audio_ms()))
                last = time.perf_counter()

    async def stop_partials(self) -> None:
        if self.sender is not None:
            self.sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Closed):
                await self.sender
            self.sender = None

    async def audio(self, data: bytes) -> None:
        try:
            x = decode_pcm(data, self.start.encoding)
        except ValueError as e:
            raise await self.conn.fail("invalid_audio", str(e)) from None
        y = self.resampler.push(torch.from_numpy(x))  # (L',) at the model rate
        self.m.scheduler.push_audio(self.stream, y)
        queued_s = self.stream.buffered / self.rate
        limit = self.conn.st.settings.max_queued_audio_s
        if queued_s > limit:
            raise await self.conn.fail(
                "queue_full",
                f"{queued_s:.1f} s of audio waiting exceeds max_queued_audio_s={limit:g}",
            )
        if self.stream.error is not None:
            raise await self.conn.fail("internal_error", str(self.stream.error))

    async def end(self) -> None:
        self.m.scheduler.push_audio(self.stream, self.resampler.flush())
        try:
            final = await self.m.scheduler.end_audio(self.stream)
        except Exception as e:  # noqa: BLE001  (its batch failed)
            raise await self.conn.fail("internal_error", str(e)) from None
        await self.stop_partials()
        await self.conn.send(result("final", self.labels, final, self.audio_ms()))

    async def close(self, reason: str) -> None:
        await self.stop_partials()
        self.m.scheduler.drop_stream(self.stream)
        self.m.scheduler.release(self.stream.slot)
        self.conn.st.session_ended(
            self.sid, self.m, "speech", self.t0, reason, audio_ms=round(self.audio_ms(), 1)
        )


@router.websocket("/v1/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    conn = Conn(ws, get_state(ws))
    sess: SpeechSession | None = None
    reason = "client_closed"
    try:
        await conn.admit()
        while True:
            text, data = await conn.receive()
            if data is not None:
                if sess is None:
                    raise await conn.fail("no_session", "send a start message before audio")
                await sess.audio(data)
                continue
            try:
                msg = _parse.validate_python(await conn.receive_json(text or ""))
            except ValidationError as e:
                raise await conn.fail("invalid_message", validation_message(e)[1]) from None
            if isinstance(msg, SpeechStart):
                if sess is not None:
                    await sess.close("restarted")
                    sess = None
                sess = await _start(conn, msg)
                await conn.send(
                    {
                        "type": "ready",
                        "session_id": sess.sid,
                        "model": sess.m.name,
                        "labels": sess.labels,
                        "sample_rate": sess.rate,
                    }
                )
            else:
                if sess is None:
                    raise await conn.fail("no_session", "end without a started stream")
                await sess.end()
                await sess.close("completed")
                sess = None
    except Closed as e:
        reason = str(e) or reason
    finally:
        if sess is not None:
            await sess.close(reason)


async def _start(conn: Conn, msg: SpeechStart) -> SpeechSession:
    st = conn.st
    try:
        m = st.pick_model(msg.model, "speech")
    except NoModelError as e:
        raise await conn.fail("unknown_model", str(e)) from None
    conn.model = m.name
    if st.full():
        st.metrics.rejections.labels("sessions_full").inc()
        raise await conn.fail("overloaded", "the server is at its session limit; retry later")
    try:
        slot = await m.scheduler.open_slot()
    except PoolFullError:
        st.metrics.rejections.labels("pool_full").inc()
        raise await conn.fail("overloaded", f"model {m.name!r} has no free session slot") from None
    sid, t0 = st.session_started(m, "speech")
    return SpeechSession(conn, m, msg, m.scheduler.open_stream(slot), sid, t0)
