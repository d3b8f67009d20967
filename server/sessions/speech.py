"""A speech session: PCM in, throttled partials and a final out (`WS /v1/speech/stream`).

The connection handler decodes PCM and hands it to the scheduler (resampling to the model's
rate runs on the engine thread); results come back on the stream's one event queue
(`Progress`* then `Final` | `Failed`), read by one task per session (`_pump`) that sends a
partial at most every `partial_interval_ms`, then the final.

Backpressure: when more than `backpressure_audio_s` of audio waits, the handler stops reading
the socket until it falls below (TCP slows the client); after `backpressure_timeout_s`, or
beyond `max_queued_audio_s`, the session is closed with `queue_full` (1013).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import time
from typing import Any

import numpy as np
import torch

from dlr_runtime.engine import SnapshotError, StreamResampler
from dlr_runtime.listen import Heard, Listener

from ..errors import Closed
from ..events import Failed, Final, Progress, Scores
from ..protocol import SpeechConfigure, SpeechEnd, SpeechStart
from ..registry import ModelEntry
from ..work import SpeechStream
from ..ws import Conn
from .listening import (
    detection_message,
    final_detections,
    listening_fields,
    make_listener,
    session_point,
)
from .store import LiveSession, SessionStore


def result(kind: str, labels: list[str], scores: Scores | None, audio_ms: float) -> dict:
    """A partial/final message from the top classes (probabilities, engine-side softmax)."""
    msg: dict = {"type": kind, "audio_ms": round(audio_ms, 1)}
    if scores is None:
        return {**msg, "label": None, "score": None, "top": []}
    top = [{"label": labels[i], "score": p} for i, p in scores.top]
    return {**msg, "label": top[0]["label"], "score": top[0]["score"], "top": top}


def decode_pcm(data: bytes, encoding: str) -> np.ndarray:
    """PCM bytes -> float32 samples in [-1, 1]; ValueError for bad length or non-finite values.
    `pcm_f32le` samples beyond full scale are clamped to [-1, 1] (like a DAC clips), so no
    client value can overflow the model's arithmetic into NaN."""
    width = 2 if encoding == "pcm_s16le" else 4
    if len(data) % width:
        raise ValueError(f"{encoding} frames must be a multiple of {width} bytes, got {len(data)}")
    if encoding == "pcm_s16le":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    x = np.frombuffer(data, dtype="<f4")
    # one pass finds any NaN/inf: a float64 sum of float32 values cannot overflow
    if not math.isfinite(np.add.reduce(x, dtype=np.float64)):
        raise ValueError("pcm_f32le samples must be finite")
    y = np.minimum(x, 1.0, dtype=np.float32)  # a new, writable float32 copy
    return np.maximum(y, -1.0, out=y)


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
    position_keys = ("bytes_received",)

    def __init__(
        self,
        store: SessionStore,
        m: ModelEntry,
        start: SpeechStart,
        stream: SpeechStream,
        bytes_received: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(store, m, **kw)
        self.start, self.stream = start, stream
        cfg = m.engine.config
        self.rate = cfg.sample_rate
        self.labels = list(cfg.labels)
        self.bytes_received = bytes_received
        self.consumed = stream.consumed  # samples fed (from the stream's events)
        self.latest: Scores | None = None  # after the last completed frame
        lis = stream.listener  # continuous mode: gate state and detections as last reported
        self.speech = lis.speech if lis is not None else False
        self.n_detections = lis.n_detections if lis is not None else 0
        self.ended = False  # the client's end arrived
        self.drained = asyncio.Event()  # a batch of this stream was processed (backpressure)
        self.final_sent: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.audio_lock = asyncio.Lock()  # one chunk at a time into the resampler; export waits
        self.checkpoint_at = bytes_received  # bytes_received of the last checkpoint taken
        self.park_lock = asyncio.Lock()  # parking, unparking and pushing audio, one at a time
        self.pump: asyncio.Task | None = asyncio.get_running_loop().create_task(self._pump())

    @classmethod
    async def create(
        cls, store: SessionStore, m: ModelEntry, slot: int, start: SpeechStart
    ) -> SpeechSession:
        """A new session around `slot` (the resampler is built on the engine thread)."""
        listener = make_listener(start, m.engine)  # ValueError: a bad continuous option
        resampler = await m.scheduler.run_sync(
            StreamResampler, start.sample_rate, m.engine.config.sample_rate
        )
        stream = m.scheduler.open_stream(slot, resampler)
        stream.listener = listener
        return cls(store, m, start, stream)

    def audio_ms(self) -> float:
        return self.consumed / self.rate * 1000

    def lag_ms(self) -> float:
        return (self.stream.received - self.consumed) / self.rate * 1000

    def message(self, kind: str, scores: Scores | None) -> dict:
        msg = result(kind, self.labels, scores, self.audio_ms())
        msg["lag_ms"] = round(self.lag_ms(), 1)
        lis = self.stream.listener
        if lis is not None:
            msg = listening_fields(self.speech, self.n_detections, self.labels, msg)
            if kind == "final":  # (no batch of this stream runs any more)
                msg["detections"] = final_detections(lis)
        return msg

    def ready(self) -> dict:
        out = {**super().ready(), "labels": self.labels, "sample_rate": self.rate}
        lis = self.stream.listener
        if lis is not None:
            out.update(mode="continuous", detection=lis.spotter.config.to_dict())
        return out

    def resume_info(self) -> dict:
        out = {
            "labels": self.labels,
            "sample_rate": self.rate,
            "bytes_received": self.bytes_received,
            "audio_ms": round(self.audio_ms(), 1),
            "ended": self.ended,
        }
        lis = self.stream.listener
        if lis is not None:  # (parked: the listener as parked; configure unparks first)
            out.update(mode="continuous", detection=lis.spotter.config.to_dict())
        return out

    def log_extra(self) -> dict:
        return {"audio_ms": round(self.audio_ms(), 1)}

    def busy(self) -> bool:
        return self.ended and not self.final_sent.done()

    def in_turn(self) -> bool:
        return self.park_lock.locked() or self.audio_lock.locked()

    # ------------------------------------------------------------------ results
    async def _pump(self) -> None:
        """Read the stream's events: partials (throttled), then the final or the failure."""
        interval = self.settings.partial_interval_ms / 1000
        interim = self.start.interim_results
        events = self.stream.events
        last, due = 0.0, False  # time of the last partial; a newer one waits to be sent
        while True:
            if due:
                wait = max(0.0, last + interval - time.perf_counter())
                try:
                    ev = await asyncio.wait_for(events.get(), wait)
                except TimeoutError:
                    await self._partial()
                    last, due = time.perf_counter(), False
                    continue
            else:
                ev = await events.get()
            match ev:
                case Progress(consumed=consumed, scores=scores, heard=heard):
                    self.consumed = consumed
                    self.latest = scores or self.latest
                    self.drained.set()
                    await self._detections(heard)
                    if interim and (self.latest is not None or heard is not None):
                        due = True
                        if time.perf_counter() >= last + interval:
                            await self._partial()
                            last, due = time.perf_counter(), False
                case Final(consumed=consumed, scores=scores, heard=heard):
                    self.consumed = consumed
                    self.latest = scores or self.latest
                    await self._detections(heard)
                    self.completed = True
                    ok = await asyncio.shield(self.emit(self.message("final", self.latest)))
                    if not ok:  # its final waits for a resume: keep it through a crash too
                        await self.checkpoint()
                    self.final_sent.set_result(ok)
                    self.pump = None
                    return
                case Failed(message=message):  # its row or batch failed: tell the client now
                    self.pump = None  # (finish must not cancel this task)
                    self.drained.set()
                    await self.fail(self.conn, "internal_error", message)
                    return

    async def _detections(self, heard: Heard | None) -> None:
        """One `detection` message per command detected in this batch, at once (not throttled)."""
        if heard is None:
            return
        self.speech, self.n_detections = heard.speech, heard.total
        first = heard.total - len(heard.detections) + 1
        for i, det in enumerate(heard.detections):
            await asyncio.shield(self.emit(detection_message(det, first + i)))

    async def _partial(self) -> None:  # (shielded: a numbered message is never half-sent)
        await asyncio.shield(self.emit(self.message("partial", self.latest)))

    async def stop_pump(self) -> None:
        task, self.pump = self.pump, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Closed):
                await task
        if not self.final_sent.done():
            self.final_sent.set_exception(Closed("closed"))
            self.final_sent.exception()  # (retrieved: no "never retrieved" warning)

    # ------------------------------------------------------------------ client messages
    async def binary(self, conn: Conn, data: bytes) -> None:
        if self.conn is not conn or self.closed:  # resumed on another connection meanwhile
            raise Closed("taken_over")
        if self.ended:
            raise await self.fail(conn, "invalid_message", "audio after end")
        try:
            x = decode_pcm(data, self.start.encoding)
        except ValueError as e:
            raise await self.fail(conn, "invalid_audio", str(e)) from None
        settings = self.settings
        queued = self.stream.buffered / self.rate + len(x) / self.start.sample_rate  # seconds
        if queued > settings.max_queued_audio_s:  # (checked before it costs any resampling)
            raise await self.fail(
                conn,
                "queue_full",
                f"{queued:.1f} s of audio waiting with this frame exceeds "
                f"max_queued_audio_s={settings.max_queued_audio_s:g}",
            )
        async with self.park_lock:  # (a parked stream comes back into a slot first)
            await self.unpark(conn)
            try:
                async with self.audio_lock:
                    await self.m.scheduler.push_audio(self.stream, torch.from_numpy(x))
                    self.bytes_received += len(data)
                self.checkpoint_due()
            except Exception as e:  # noqa: BLE001  (its resampling failed)
                raise await self.fail(conn, "internal_error", str(e)) from None
        self.idle_since = time.monotonic()
        if self.stream.buffered / self.rate > settings.backpressure_audio_s:
            await self._hold_back(conn)
        if self.closed:
            raise Closed("internal_error")

    async def _hold_back(self, conn: Conn) -> None:
        """Stop reading this socket until the queue is below the backpressure level."""
        settings, s = self.settings, self.stream
        deadline = time.perf_counter() + settings.backpressure_timeout_s
        while s.buffered / self.rate > settings.backpressure_audio_s and not self.closed:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise await self.fail(
                    conn,
                    "queue_full",
                    f"audio arrives faster than it is processed: {s.buffered / self.rate:.1f} s "
                    f"queued for {settings.backpressure_timeout_s:g} s; send at real-time pace",
                )
            self.drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.drained.wait(), min(left, 0.5))

    async def handle(self, conn: Conn, msg: SpeechEnd | SpeechConfigure) -> bool:
        """The client's end: emit the final once all audio is processed; False (the session
        is over) once it is delivered. A `configure` changes the detection options."""
        if isinstance(msg, SpeechConfigure):
            await self.configure(conn, msg)
            return True
        if self.ended:
            raise await self.fail(conn, "invalid_message", "end was already received")
        async with self.park_lock:
            await self.unpark(conn)
            self.ended = True
            try:
                async with self.audio_lock:
                    await self.m.scheduler.end_audio(self.stream)
            except Exception as e:  # noqa: BLE001  (its resampling failed)
                raise await self.fail(conn, "internal_error", str(e)) from None
        delivered = await self.final_sent
        if not delivered:  # the final waits in the outbox for a resume
            raise Closed("final_undelivered", by_client=True, code=1006)
        await self.store.finish(self, "completed")
        return False

    async def configure(self, conn: Conn, msg: SpeechConfigure) -> None:
        """Continuous mode: new detection options from the next frame the engine processes;
        answered with `configured` (the whole operating point and the audio time it applies
        from). A bad option is refused like one of `start` (error, close 1008)."""
        if self.ended:
            raise await self.fail(conn, "invalid_message", "configure after end")
        changes = msg.model_dump(exclude_unset=True, exclude_none=True, exclude={"type"})
        if not changes:
            raise await self.fail(
                conn, "invalid_message", "configure needs one of threshold, keywords, listen, "
                "refractory_ms"
            )  # fmt: skip
        async with self.park_lock:
            await self.unpark(conn)
            lis = self.stream.listener
            if lis is None:
                raise await self.fail(
                    conn, "invalid_message", 'configure needs "mode": "continuous"'
                )
            cfg = session_point(lis.spotter.config, changes, self.start.keywords)

            def apply() -> int:  # on the engine thread, between batches
                lis.spotter.reconfigure(cfg)
                return lis.spotter.frame

            try:
                frame = await self.m.scheduler.run_sync(apply)
            except ValueError as e:
                raise await self.fail(conn, "invalid_message", str(e)) from None
            self.start = self.start.model_copy(update=changes)
        reply = {
            "type": "configured",
            "detection": cfg.to_dict(),
            "audio_ms": round(frame * lis.frame_ms, 1),
        }
        await asyncio.shield(self.emit(reply))

    # ------------------------------------------------------------------ durable checkpoints
    def checkpoint_due(self) -> None:
        """Every `checkpoint_audio_s` of audio received: write a checkpoint in the background."""
        d = self.store.ctx.durable
        if d is None or not d.checkpoints:
            return
        width = 2 if self.start.encoding == "pcm_s16le" else 4
        every = int(self.settings.checkpoint_audio_s * self.start.sample_rate) * width
        if self.bytes_received - self.checkpoint_at >= every:
            self.checkpoint_at = self.bytes_received
            self.store.spawn(self.checkpoint())

    def resync(self, client_seq: int) -> None:
        # partials are throttled by the clock: redone ones may be more or fewer than the lost
        self.outbox.seq = max(self.outbox.seq, client_seq)

    # ------------------------------------------------------------------ state
    async def export(self, persist: bool = False) -> bytes:
        if self.parked:
            return await self.parked_state()
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
                "resampler": s.resampler.state_dict(),
            }

        def listener() -> dict:  # on the engine thread, after every batch already formed
            return {} if s.listener is None else {"listener": s.listener.snapshot()}

        async with self.audio_lock:  # no chunk half-way through the resampler
            return await self.snapshot(s.slot, fields, persist, listener)

    @staticmethod
    async def stream_of(
        store: SessionStore, m: ModelEntry, slot: int, extra: dict
    ) -> tuple[SpeechStart, SpeechStream, torch.Tensor, int]:
        """(start, a stream around the restored `slot`, its buffered audio, bytes received)
        from a snapshot's extra (ValueError when it is malformed)."""
        start = SpeechStart.model_validate(extra["start"])
        resampler = await m.scheduler.run_sync(StreamResampler.from_state, extra["resampler"])
        if resampler.orig != start.sample_rate or resampler.new != m.engine.config.sample_rate:
            raise ValueError("resampler rates do not match the session")
        limit = int(store.ctx.settings.max_queued_audio_s * m.engine.config.sample_rate) + 1
        buffered = _unb64(extra["buffered"], limit)
        consumed, nbytes = int(extra["consumed"]), int(extra["bytes_received"])
        if consumed < 0 or nbytes < 0:
            raise ValueError("negative stream position")
        listener = None
        if start.mode == "continuous":
            cfg = m.engine.config
            listener = Listener.restore(
                extra["listener"], list(cfg.labels), cfg.frame_stride, cfg.sample_rate
            )
        stream = m.scheduler.open_stream(slot, resampler)
        stream.consumed = stream.received = consumed
        stream.listener = listener
        return start, stream, buffered, nbytes

    @classmethod
    async def from_extra(
        cls, store: SessionStore, m: ModelEntry, slot: int, extra: dict, **kw: Any
    ) -> SpeechSession:
        """Rebuild a session around a restored slot (ValueError when `extra` is malformed)."""
        start, stream, buffered, nbytes = await cls.stream_of(store, m, slot, extra)
        sess = cls(store, m, start, stream, nbytes, **kw)
        m.scheduler.queue_audio(stream, buffered)
        return sess

    # ------------------------------------------------------------------ parking
    def parkable(self) -> bool:
        """A stream whose client is gone (waiting for a resume), or idle past
        `park_after_idle_s`, with nothing in flight; a connected stream that sent audio
        recently is never pushed out for another session."""
        if self.park_lock.locked() or not self._idle():
            return False
        after = self.settings.park_after_idle_s
        return self.conn is None or (after > 0 and time.monotonic() - self.idle_since >= after)

    def _idle(self) -> bool:
        """Every received sample fed (only a partial frame waits), no result pending, no
        push or end under way."""
        s = self.stream
        return not (
            self.parked
            or self.closed
            or self.ended
            or self.completed
            or self.audio_lock.locked()
            or s.buffered >= s.stride
            or s.received != s.consumed + s.buffered
            or not s.events.empty()
            or self.consumed != s.consumed
        )

    async def park(self) -> bool:
        """Seal the idle stream (state, resampler, listener, partial frame, outbox) into the
        parked tier and free its slot; the next frame, `end` or export restores it."""
        d = self.store.ctx.durable
        if d is None or not self.parkable():
            return False
        async with self.park_lock:  # (no audio is pushed meanwhile: binary() waits)
            if not self._idle():
                return False
            try:
                blob = await self.export(persist=True)
            except SnapshotError:
                return False
            if not self._idle():  # (a batch reported meanwhile, or the session ended)
                return False
            await d.park(self.sid, d.seal(self.m, blob, self.sid))
            if not self.parked_in_time():  # finished during the store write
                return False
            # no await from the check to here: a finish from now on sees `parked` and frees
            # no slot (the slot is closed below) and gives back the count taken here
            self.parked = True
            self.counted(-1)
            await self.stop_pump()
            self.m.scheduler.drop_stream(self.stream)
            await self.m.scheduler.close_slot(self.stream.slot)
        return True

    async def unpark(self, conn: Conn | None) -> None:
        """Bring a parked stream back into a slot (the caller holds `park_lock`)."""
        if not self.parked:
            return
        d = self.store.ctx.durable
        assert d is not None
        t0 = time.perf_counter()
        slot, payload = await self.parked_slot(conn)
        m = self.m
        stream = None
        try:
            extra = await m.scheduler.run_sync(m.engine.restore, slot, payload)
            _, stream, buffered, _ = await self.stream_of(self.store, m, slot, extra)
            if self.closed:  # finished meanwhile (it gave back the count as parked)
                raise Closed(self.end_reason or "closed")
        except BaseException:
            if stream is not None:
                m.scheduler.drop_stream(stream)
            m.scheduler.release(slot)
            raise
        self.stream, self.consumed = stream, stream.consumed
        self.drained = asyncio.Event()
        self.final_sent = asyncio.get_running_loop().create_future()
        self.pump = asyncio.get_running_loop().create_task(self._pump())
        m.scheduler.queue_audio(stream, buffered)
        self.parked = False
        self.counted(+1)
        d.metrics.park_seconds.labels("unpark").observe(time.perf_counter() - t0)

    async def release(self) -> None:
        if self.parked:  # (no slot, no pump: give back the count `park` took)
            self.parked = False
            self.counted(+1)
            return
        await self.stop_pump()
        self.m.scheduler.drop_stream(self.stream)
        self.m.scheduler.release(self.stream.slot)
