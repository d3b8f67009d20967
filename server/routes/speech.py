"""`WS /v1/speech/stream`: streaming speech-command classification.

Protocol: client `{"type":"start","sample_rate","encoding","model","interim_results"}` ->
server `{"type":"ready","session_id","resume_token","model","labels","sample_rate"}`; then
binary frames of mono PCM (pcm_s16le or pcm_f32le) at the client's rate, resampled statefully
to the model's rate; the server sends `{"type":"partial","audio_ms","lag_ms","label","score",
"top","seq"}` at most every `partial_interval_ms` (`lag_ms`: audio received but not yet
processed); client `{"type":"end"}` -> `{"type":"final",...}` (same fields). Another `start`
may follow on the same connection. Errors: `{"type":"error","code","message"}` + close.

Resume (see server/sessions.py): after a dropped connection, `{"type":"resume","session_id",
"resume_token","last_seq"?}` on a new connection -> `ready` with `"resumed": true`,
`bytes_received` (audio bytes the server accepted: re-send from there), `audio_ms` (processed)
and `ended`; audio accepted before the drop is processed while detached, missed partials are
re-sent from the outbox (up to `resume_buffer_messages`) and the final always covers all of it.

Backpressure: when more than `backpressure_audio_s` of audio waits, the server stops reading
the socket until it falls below (TCP slows the client); after `backpressure_timeout_s`, or
beyond `max_queued_audio_s`, the session is closed with `queue_full` (1013).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from typing import Any

import numpy as np
import torch
from fastapi import APIRouter, WebSocket
from pydantic import TypeAdapter, ValidationError

from dlr_runtime.engine import SnapshotError, StreamResampler

from ..errors import validation_message
from ..protocol import SpeechMessage, SpeechStart
from ..registry import ModelEntry
from ..scheduler import SpeechStream
from ..sessions import LiveSession, connection_over, open_slot, register, resume
from ..state import ServerState, get_state
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


def _b64(x: torch.Tensor) -> str:
    return base64.b64encode(x.to(torch.float32).contiguous().numpy().tobytes()).decode()


def _unb64(s: str, limit: int) -> torch.Tensor:
    raw = base64.b64decode(s, validate=True)
    if len(raw) % 4 or len(raw) // 4 > limit:
        raise ValueError("bad sample buffer")
    if not raw:
        return torch.zeros(0)
    x = torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()
    if not torch.isfinite(x).all():
        raise ValueError("buffered samples must be finite")
    return x


class SpeechSession(LiveSession):
    kind = "speech"

    def __init__(
        self,
        st: ServerState,
        m: ModelEntry,
        start: SpeechStart,
        stream: SpeechStream,
        resampler: StreamResampler | None = None,
        bytes_received: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(st, m, **kw)
        self.start, self.stream = start, stream
        cfg = m.engine.config
        self.rate = cfg.sample_rate
        self.labels = list(cfg.labels)
        self.resampler = resampler or StreamResampler(start.sample_rate, self.rate)
        self.bytes_received = bytes_received
        self.ended = False  # the client's end arrived
        self.sender: asyncio.Task | None = None
        self.finisher: asyncio.Task | None = None
        if start.interim_results:
            self.sender = asyncio.get_running_loop().create_task(self._partials())

    def audio_ms(self) -> float:
        return self.stream.consumed / self.rate * 1000

    def lag_ms(self) -> float:
        return (self.stream.received - self.stream.consumed) / self.rate * 1000

    def message(self, kind: str, scores: torch.Tensor | None) -> dict:
        msg = result(kind, self.labels, scores, self.audio_ms())
        msg["lag_ms"] = round(self.lag_ms(), 1)
        return msg

    def ready(self) -> dict:
        return {
            "type": "ready",
            "session_id": self.sid,
            "resume_token": self.token,
            "model": self.m.name,
            "labels": self.labels,
            "sample_rate": self.rate,
        }

    def resume_info(self) -> dict:
        return {
            "labels": self.labels,
            "sample_rate": self.rate,
            "bytes_received": self.bytes_received,
            "audio_ms": round(self.audio_ms(), 1),
            "ended": self.ended,
        }

    def log_extra(self) -> dict:
        return {"audio_ms": round(self.audio_ms(), 1)}

    async def _fail(self, conn: Conn | None, code: str, message: str) -> Closed:
        """Error to the client (if connected), then close the session for good."""
        err = Closed(code)
        if conn is not None:
            err = await conn.fail(code, message)
        else:
            self.st.metrics.evictions.labels(self.m.name, code).inc()
        await self.st.store.finish(self, code)
        return err

    async def _partials(self) -> None:
        interval = self.st.settings.partial_interval_ms / 1000
        last = 0.0
        s = self.stream
        while True:
            await s.progress.wait()
            wait = last + interval - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            s.progress.clear()
            if s.error is not None:  # its batch failed: tell the client now
                self.sender = None  # (finish must not cancel this task)
                await self._fail(self.conn, "internal_error", str(s.error))
                return
            if s.latest is not None:  # (shielded: a numbered message is never half-sent)
                await asyncio.shield(self.emit(self.message("partial", s.latest)))
                last = time.perf_counter()

    async def stop_partials(self) -> None:
        if self.sender is not None:
            self.sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Closed):
                await self.sender
            self.sender = None

    async def audio(self, conn: Conn, data: bytes) -> None:
        if self.conn is not conn or self.closed:  # resumed on another connection meanwhile
            raise Closed("taken_over")
        if self.ended:
            raise await self._fail(conn, "invalid_message", "audio after end")
        try:
            x = decode_pcm(data, self.start.encoding)
        except ValueError as e:
            raise await self._fail(conn, "invalid_audio", str(e)) from None
        y = self.resampler.push(torch.from_numpy(x))  # (L',) at the model rate
        self.m.scheduler.push_audio(self.stream, y)
        self.bytes_received += len(data)
        settings = self.st.settings
        s = self.stream
        if s.buffered / self.rate > settings.max_queued_audio_s:
            raise await self._fail(
                conn,
                "queue_full",
                f"{s.buffered / self.rate:.1f} s of audio waiting exceeds "
                f"max_queued_audio_s={settings.max_queued_audio_s:g}",
            )
        if s.buffered / self.rate > settings.backpressure_audio_s:
            await self._hold_back(conn)
        if s.error is not None:
            raise await self._fail(conn, "internal_error", str(s.error))

    async def _hold_back(self, conn: Conn) -> None:
        """Stop reading this socket until the queue is below the backpressure level."""
        settings, s = self.st.settings, self.stream
        deadline = time.perf_counter() + settings.backpressure_timeout_s
        while s.buffered / self.rate > settings.backpressure_audio_s and s.error is None:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise await self._fail(
                    conn,
                    "queue_full",
                    f"audio arrives faster than it is processed: {s.buffered / self.rate:.1f} s "
                    f"queued for {settings.backpressure_timeout_s:g} s; send at real-time pace",
                )
            s.fed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(s.fed.wait(), min(left, 0.5))

    async def end(self, conn: Conn) -> None:
        """The client's end: emit the final once all audio is processed."""
        if self.ended:
            raise await self._fail(conn, "invalid_message", "end was already received")
        self.ended = True
        self.m.scheduler.push_audio(self.stream, self.resampler.flush())
        delivered = await self._finish_stream()
        if not delivered:  # the final waits in the outbox for a resume
            raise Closed("final_undelivered", by_client=True, code=1006)
        await self.st.store.finish(self, "completed")

    async def _finish_stream(self) -> bool:
        try:
            final = await self.m.scheduler.end_audio(self.stream)
        except Exception as e:  # noqa: BLE001  (its batch failed)
            raise await self._fail(self.conn, "internal_error", str(e)) from None
        await self.stop_partials()
        self.completed = True
        return await self.emit(self.message("final", final))

    async def export(self, persist: bool = False) -> bytes:
        if self.ended and not self.completed:
            raise SnapshotError("the stream is ending; export it before end or after final")
        s = self.stream

        def fields() -> dict:
            buffered = torch.cat(s.chunks) if s.chunks else torch.zeros(0)  # (buffered,)
            return {
                "kind": "speech",
                "start": self.start.model_dump(),
                "bytes_received": self.bytes_received,
                "consumed": s.received - s.buffered,
                "buffered": _b64(buffered),
                "resampler": self.resampler.state_dict(),
            }

        return await self.snapshot(s.slot, fields, persist)

    @classmethod
    def from_extra(
        cls, st: ServerState, m: ModelEntry, slot: int, extra: dict, **kw: Any
    ) -> SpeechSession:
        """Rebuild a session around a restored slot (ValueError when `extra` is malformed)."""
        start = SpeechStart.model_validate(extra["start"])
        resampler = StreamResampler.from_state(extra["resampler"])
        if resampler.orig != start.sample_rate or resampler.new != m.engine.config.sample_rate:
            raise ValueError("resampler rates do not match the session")
        limit = int(st.settings.max_queued_audio_s * m.engine.config.sample_rate) + 1
        buffered = _unb64(extra["buffered"], limit)
        consumed, nbytes = int(extra["consumed"]), int(extra["bytes_received"])
        if consumed < 0 or nbytes < 0:
            raise ValueError("negative stream position")
        stream = m.scheduler.open_stream(slot)
        stream.consumed = stream.received = consumed
        sess = cls(st, m, start, stream, resampler, nbytes, **kw)
        m.scheduler.push_audio(stream, buffered)
        return sess

    async def release(self) -> None:
        await self.stop_partials()
        self.m.scheduler.drop_stream(self.stream)
        self.m.scheduler.release(self.stream.slot)


@router.websocket("/v1/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    conn = Conn(ws, get_state(ws))
    st = conn.st
    sess: SpeechSession | None = None
    try:
        await conn.admit()
        while True:
            text, data = await conn.receive()
            if data is not None:
                if sess is None:
                    raise await conn.fail("no_session", "send a start message before audio")
                await sess.audio(conn, data)
                continue
            obj = await conn.receive_json(text or "")
            if obj.get("type") == "resume":
                if sess is not None:
                    raise await conn.fail("invalid_message", "resume must open a connection")
                sess = await resume(conn, obj, "speech")  # type: ignore[assignment]
                continue  # None: it had completed and its final was re-sent
            try:
                msg = _parse.validate_python(obj)
            except ValidationError as e:
                raise await conn.fail("invalid_message", validation_message(e)[1]) from None
            if isinstance(msg, SpeechStart):
                if sess is not None:
                    await st.store.finish(sess, "restarted")
                    sess = None
                sess = await _start(conn, msg)
                await conn.send(sess.ready())
                sess.conn = conn
            else:
                if sess is None and conn.last_final is not None:  # end re-sent after a resume
                    await conn.send(conn.last_final)
                    conn.last_final = None
                    continue
                if sess is None:
                    raise await conn.fail("no_session", "end without a started stream")
                await sess.end(conn)
                sess = None
    except Closed as e:
        await connection_over(conn, sess, e)
        sess = None
    finally:
        await connection_over(conn, sess, None)  # cancelled (server stopping)


async def _start(conn: Conn, msg: SpeechStart) -> SpeechSession:
    m, slot = await open_slot(conn, msg.model, "speech")
    return register(conn, SpeechSession(conn.st, m, msg, m.scheduler.open_stream(slot)))  # type: ignore[return-value]
