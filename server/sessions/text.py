"""Text sessions: the persistent WebSocket session (`TextLive`, `WS /v1/generate/stream`) and the
short-lived HTTP generation (`generation()`, `POST /v1/generate` and `/v1/completions`).

Both feed text into a slot's state and read one generation's typed events (`Token`* then
`Done` | `Failed`) from the scheduler. Generated tokens stay in the state, so a WebSocket
turn costs only its own new tokens.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import torch

from dlr_runtime.engine import PoolFullError, SamplingParams, SnapshotError
from dlr_runtime.engine.slot_state import copy_state

from ..admission import Refusal, pool_full, refusal
from ..context import AppContext
from ..errors import Closed
from ..events import Done, Failed, GenEvent, Token
from ..protocol import SamplingFields, TextAppend, TextFork, TextGenerate, TextStart
from ..registry import ModelEntry
from ..work import BatchError, Generation, TextSession
from ..ws import Conn
from .store import LiveSession, SessionStore, owned_slot


class PromptTooLong(ValueError):
    """A prompt (or appended text) longer than `max_prompt_tokens` tokens."""

    def __init__(self, field: str, n: int, limit: int) -> None:
        super().__init__(f"{field}: {n} tokens, more than max_prompt_tokens={limit}")
        self.field = field


def encode_capped(m: ModelEntry, text: str, limit: int, field: str) -> list[int]:
    """`text` as tokens of `m`; PromptTooLong beyond `limit` tokens (the cap is in tokens:
    characters of up to 4 UTF-8 bytes make up to 4 byte-level tokens each)."""
    toks = m.engine.tokenizer.encode(text)
    if len(toks) > limit:
        raise PromptTooLong(field, len(toks), limit)
    return toks


class TextLive(LiveSession):
    kind = "text"
    position_keys = ("messages_received",)

    def __init__(
        self,
        store: SessionStore,
        m: ModelEntry,
        text: TextSession,
        appended: int = 0,
        messages_received: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(store, m, **kw)
        self.text = text
        self.appended = appended  # tokens appended since the last generate (prompt_tokens)
        self.messages_received = messages_received
        self.g: Generation | None = None
        self.pump: asyncio.Task | None = None
        self.turn_lock = asyncio.Lock()  # a turn, or parking, at a time

    @classmethod
    async def create(
        cls, store: SessionStore, m: ModelEntry, slot: int, msg: TextStart
    ) -> TextLive:
        return cls(store, m, TextSession(slot=slot, pending=[m.engine.tokenizer.bos]))

    def resume_info(self) -> dict:
        return {"messages_received": self.messages_received, "generating": self.g is not None}

    def busy(self) -> bool:
        return self.pump is not None

    def in_turn(self) -> bool:
        return self.turn_lock.locked()

    async def wait_turn(self) -> None:
        """Wait for the running generation (started on this or an earlier connection)."""
        if self.pump is not None:
            await asyncio.shield(self.pump)

    async def handle(self, conn: Conn, msg: TextAppend | TextGenerate | TextFork) -> bool:
        async with self.turn_lock:
            await self.unpark(conn)
            if isinstance(msg, TextAppend):
                await self.append(conn, msg)
            elif isinstance(msg, TextFork):
                await self.answer_fork()
            else:
                await self.generate(conn, msg)
        self.idle_since = time.monotonic()
        return True

    async def answer_fork(self) -> None:
        try:
            new = await self.fork()
        except ForkRefused as e:
            await self.emit({"type": "error", "code": e.code, "message": str(e)})
            return
        await self.emit(
            {
                "type": "forked",
                "session_id": new.sid,
                "resume_token": new.token,
                "resume_grace_s": self.settings.resume_grace_s,
            }
        )

    async def fork(self) -> TextLive:
        """A new detached session holding a copy of this one's state (between turns); the
        client attaches to it with `resume`. Raises ForkRefused (no capacity, or busy)."""
        if self.g is not None or self.text.inflight is not None:
            raise ForkRefused("session_busy", "a generation or prefill is running")
        ctx, m, t = self.store.ctx, self.m, self.text
        r = refusal(ctx, model=m)
        if r is not None:
            raise ForkRefused("overloaded", r.message, r)
        try:
            async with owned_slot(m) as slot:
                await m.scheduler.run_sync(copy_state, m.engine, t.slot, slot)
                logits = None if t.last_logits is None else t.last_logits.clone()
                copy = TextSession(slot=slot, pending=list(t.pending), last_logits=logits)
                new = self.store.register(
                    TextLive(self.store, m, copy, self.appended, self.messages_received)
                )
        except PoolFullError:
            r = pool_full(ctx, m)
            raise ForkRefused("overloaded", r.message, r) from None
        self.store.detach(new)
        return new

    async def append(self, conn: Conn, msg: TextAppend) -> None:
        limit = self.settings.max_prompt_chars
        if len(msg.text) > limit:
            raise await self.fail(
                conn, "invalid_message", f"text: longer than max_prompt_chars={limit}"
            )
        try:
            toks = encode_capped(self.m, msg.text, self.settings.max_prompt_tokens, "text")
        except PromptTooLong as e:
            raise await self.fail(conn, "invalid_message", str(e)) from None
        self.messages_received += 1
        if not toks:
            return
        feed = self.text.pending + toks
        self.text.pending = []
        self.appended += len(feed)
        try:
            await self.m.scheduler.prefill(self.text, feed)
        except Exception as e:  # noqa: BLE001  (its row or batch failed)
            raise await self.fail(conn, "internal_error", str(e)) from None

    async def generate(self, conn: Conn, msg: TextGenerate) -> None:
        if msg.max_new_tokens > self.settings.max_new_tokens:
            raise await self.fail(
                conn, "invalid_message", f"max_new_tokens: at most {self.settings.max_new_tokens}"
            )
        self.messages_received += 1
        params = msg.to_sampling(msg.max_new_tokens)
        prompt_tokens = self.appended + len(self.text.pending)
        self.appended = 0
        if params.max_tokens == 0:
            await self.emit(_done_msg("length", params, prompt_tokens, 0))
            return
        self.g = self.m.scheduler.generate(self.text, params)
        self.pump = asyncio.get_running_loop().create_task(self._pump(params, prompt_tokens))
        await self.wait_turn()

    async def _pump(self, params: SamplingParams, prompt_tokens: int) -> None:
        """Forward one generation's events to the outbox (and the connection, if any)."""
        g = self.g
        assert g is not None
        try:
            while True:
                match await g.events.get():
                    case Token(id=tid, text=text):
                        await self.emit({"type": "token", "text": text, "id": tid})
                    case Done(reason=reason, tail=tail, completion_tokens=n):
                        if tail:
                            await self.emit({"type": "token", "text": tail, "id": None})
                        await self.emit(_done_msg(reason, params, prompt_tokens, n))
                        self.g = None
                        await self.checkpoint()  # a finished turn: a safe point
                        return
                    case Failed(message=message):
                        self.g = self.pump = None  # (finish must not wait for this task)
                        await self.fail(self.conn, "internal_error", message)
                        return
        finally:
            self.g = None
            self.pump = None

    def cancel(self) -> None:
        if self.g is not None:
            self.m.scheduler.cancel(self.g)

    async def export(self, persist: bool = False) -> bytes:
        if self.parked:
            return await self.parked_state()
        if self.g is not None or self.text.inflight is not None:
            raise SnapshotError("a generation or prefill is running; export between turns")
        t = self.text

        def fields() -> dict:
            logits = None
            if t.last_logits is not None:
                raw = t.last_logits.to(torch.float32).contiguous().numpy().tobytes()
                logits = base64.b64encode(raw).decode()
            return {
                "kind": "text",
                "pending": list(t.pending),
                "last_logits": logits,
                "appended": self.appended,
                "messages_received": self.messages_received,
            }

        return await self.snapshot(t.slot, fields, persist)

    @classmethod
    async def from_extra(
        cls, store: SessionStore, m: ModelEntry, slot: int, extra: dict, **kw: Any
    ) -> TextLive:
        return cls(
            store,
            m,
            text_state(m, slot, extra),
            appended=max(0, int(extra.get("appended", 0))),
            messages_received=max(0, int(extra.get("messages_received", 0))),
            **kw,
        )

    async def release(self) -> None:
        if self.parked:  # (no slot: give back the count `park` took)
            self.parked = False
            self.counted(+1)
            return
        self.m.scheduler.release(self.text.slot, self.text, self.g)

    # ------------------------------------------------------------------ parking
    def parkable(self) -> bool:
        return not (
            self.parked
            or self.closed
            or self.g is not None
            or self.pump is not None
            or self.text.inflight is not None
            or self.turn_lock.locked()
        )

    async def park(self) -> bool:
        """Between turns: seal the state into the parked tier and free the slot."""
        d = self.store.ctx.durable
        if d is None or not self.parkable():
            return False
        async with self.turn_lock:
            if not self.parkable_now():
                return False
            try:
                blob = await self.export(persist=True)
            except SnapshotError:
                return False
            await d.park(self.sid, d.seal(self.m, blob, self.sid))
            if not self.parked_in_time():  # finished during the store write
                return False
            self.parked = True  # (with the count, before the await: see SpeechSession.park)
            self.counted(-1)
            await self.m.scheduler.close_slot(self.text.slot)
        return True

    def parkable_now(self) -> bool:
        return not (self.parked or self.closed or self.g is not None or self.text.inflight)

    async def unpark(self, conn: Conn | None) -> None:
        """Bring a parked session back into a slot (the caller holds `turn_lock`)."""
        if not self.parked:
            return
        d = self.store.ctx.durable
        assert d is not None
        t0 = time.perf_counter()
        slot, payload = await self.parked_slot(conn)
        m = self.m
        try:
            extra = await m.scheduler.run_sync(m.engine.restore, slot, payload)
            if self.closed:  # finished meanwhile (it gave back the count as parked)
                raise Closed(self.end_reason or "closed")
            self.text = text_state(m, slot, extra)
        except BaseException:
            m.scheduler.release(slot)
            raise
        self.parked = False
        self.counted(+1)
        d.metrics.park_seconds.labels("unpark").observe(time.perf_counter() - t0)


def text_state(m: ModelEntry, slot: int, extra: dict) -> TextSession:
    """The text session around a restored `slot` (ValueError when `extra` is malformed)."""
    vocab = m.engine.config.vocab_size
    pending = [int(x) for x in extra["pending"]]
    if len(pending) > 4096 or any(not 0 <= x < vocab for x in pending):
        raise ValueError("pending tokens out of range")
    logits = None
    if extra.get("last_logits") is not None:
        raw = base64.b64decode(extra["last_logits"], validate=True)
        if len(raw) != 4 * m.engine.config.out_dim:
            raise ValueError("last_logits has the wrong size")
        logits = torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()  # (V,)
        if not torch.isfinite(logits).all():
            raise ValueError("last_logits must be finite")
    if not pending and logits is None:
        pending = [m.engine.tokenizer.bos]
    return TextSession(slot=slot, pending=pending, last_logits=logits)


class ForkRefused(Exception):
    """A fork that cannot be made now: `code` says why, `refusal` when for capacity."""

    def __init__(self, code: str, message: str, refusal: Refusal | None = None) -> None:
        super().__init__(message)
        self.code, self.refusal = code, refusal


def _done_msg(reason: str, params: SamplingParams, prompt_tokens: int, n: int) -> dict:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n}
    return {"type": "done", "finish_reason": reason, "seed": params.seed, "usage": usage}


# ---------------------------------------------------------------------- HTTP generation
class Run:
    """One HTTP generation; owns its slot from `open_generation` until `close()` (idempotent,
    called when its events end, however they end, and again by the response's background)."""

    def __init__(
        self, ctx: AppContext, m: ModelEntry, slot: int, feed: list[int], params: SamplingParams
    ) -> None:
        self.ctx, self.m, self.params = ctx, m, params
        self.seed, self.prompt_tokens = params.seed, len(feed)
        self.cached_tokens = 0  # prompt tokens served from the prefix cache
        self.created = time.perf_counter()
        self.session = TextSession(slot=slot, pending=feed)
        self.g: Generation | None = None
        self.reason = "error"
        self.closed = False
        self.sid, self.t0 = ctx.session_started(m, "generate")

    async def events(self) -> AsyncIterator[GenEvent]:
        """`Token`*, then `Done` or `Failed`."""
        try:
            if self.params.max_tokens == 0:
                self.reason = "length"
                yield Done("length", "", 0)
                return
            feed, self.session.pending = self.session.pending, []
            try:  # the prompt through the prefix cache, then sampling from its logits
                self.cached_tokens = await self.m.scheduler.prefill_prompt(self.session, feed)
            except BatchError as e:
                yield Failed(str(e))
                return
            self.g = g = self.m.scheduler.generate(self.session, self.params)
            g.created = self.created
            while True:
                ev = await g.events.get()
                if isinstance(ev, Done):
                    self.reason = ev.reason
                yield ev
                if not isinstance(ev, Token):
                    return
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.m.scheduler.release(self.session.slot, self.session, self.g)
        self.ctx.session_ended(self.sid, self.m, "generate", self.t0, self.reason)


async def open_generation(
    ctx: AppContext, m: ModelEntry, prompt: str, req: SamplingFields, max_tokens: int
) -> Run:
    """Take a slot for [bos] + prompt (PoolFullError when none is free, PromptTooLong beyond
    `max_prompt_tokens`); the `Run` owns it."""
    toks = encode_capped(m, prompt, ctx.settings.max_prompt_tokens, "prompt")
    feed = [m.engine.tokenizer.bos, *toks]
    async with owned_slot(m) as slot:
        return Run(ctx, m, slot, feed, req.to_sampling(max_tokens))
