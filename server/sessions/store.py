"""Live WebSocket sessions that outlive their connection: ids, resume tokens, replay, grace.

Every WebSocket session (speech or text) is a `LiveSession` registered in the server's
`SessionStore` under a random id (uuid4 hex) with a random resume token (only its sha256 is
kept; checks use `hmac.compare_digest`). Every server message of a session after `ready` goes
through `emit()`, which numbers it (`seq`, 1, 2, ...) and keeps the last
`resume_buffer_messages` in an outbox. When the connection drops without a clean close (code
1000), the session is *detached*: its slot, queued audio and running generation stay, work
that was accepted keeps being processed, and its messages keep going to the outbox; after
`resume_grace_s` without a resume it is closed (eviction reason `resume_expired`).

A client resumes with `{"type":"resume","session_id","resume_token","last_seq"?}` as the first
message of a new connection; the server answers `ready` with `"resumed": true` and the
session's position (speech: `bytes_received`, text: `messages_received`), then re-sends every
kept message with `seq > last_seq` (default: the messages whose send failed), then continues.

Ownership: a state slot is taken inside `owned_slot(m)`, whose failure path always gives it back;
once a session is registered (`SessionStore.register`) the session owns the slot and
`SessionStore.finish` frees it. The store is built by `create_app` and reached by routes through
`StoreDep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import HTTPConnection

from ..context import AppContext
from ..errors import Closed
from ..registry import ModelEntry
from ..settings import Settings
from ..ws import Conn

log = logging.getLogger("dlr.server")


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class ResumeMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str
    session_id: str = Field(max_length=64)
    resume_token: str = Field(max_length=256)
    last_seq: int | None = Field(None, ge=0)


class Outbox:
    """Numbered server messages of one session; the last `maxlen` are kept for replay."""

    def __init__(self, maxlen: int, seq: int = 0, items: list[dict] | None = None) -> None:
        self.seq = seq
        self.buf: deque[dict] = deque(items or [], maxlen=maxlen)

    def add(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        out = {**msg, "seq": self.seq}
        self.buf.append(out)
        return out

    def since(self, last: int) -> list[dict]:
        return [m for m in self.buf if m["seq"] > last]

    def truncated(self, last: int) -> bool:
        """Some messages after `last` are no longer kept."""
        first = self.buf[0]["seq"] if self.buf else self.seq + 1
        return last < self.seq and first > last + 1


class LiveSession:
    """Base of the speech and text sessions (see the module docstring)."""

    kind = ""

    def __init__(
        self,
        store: SessionStore,
        m: ModelEntry,
        sid: str | None = None,
        token_hash: bytes | None = None,
        outbox: Outbox | None = None,
        sent_seq: int = 0,
    ) -> None:
        self.store, self.m = store, m
        settings = store.ctx.settings
        self.sid = sid or uuid.uuid4().hex
        self.token: str | None = None  # given to the client once, never stored in clear
        if token_hash is None:
            self.token = secrets.token_urlsafe(32)
            token_hash = hash_token(self.token)
        self.token_hash = token_hash
        self.outbox = outbox or Outbox(settings.resume_buffer_messages)
        self.sent_seq = sent_seq  # highest seq whose send succeeded
        self.conn: Conn | None = None
        self.closed = False
        self.completed = False  # its work is over; only a final message may await replay
        self.t0 = time.perf_counter()
        self.detached_since: float | None = None
        self._expiry: asyncio.Task | None = None

    async def emit(self, msg: dict[str, Any]) -> bool:
        """Number, keep and send a message; False when it could not be sent now."""
        msg = self.outbox.add(msg)
        conn = self.conn
        if conn is None:
            return False
        try:
            await conn.send(msg)
        except Closed:
            return False
        self.sent_seq = max(self.sent_seq, msg["seq"])
        return True

    def persist_fields(self) -> dict[str, Any]:
        """Identity and replay buffer, for the states written on drain."""
        return {
            "session_id": self.sid,
            "token_sha256": self.token_hash.hex(),
            "seq": self.outbox.seq,
            "sent_seq": self.sent_seq,
            "outbox": list(self.outbox.buf),
            "completed": self.completed,
        }

    async def snapshot(self, slot: int, fields, persist: bool, engine_fields=None) -> bytes:
        """The slot's state with `fields()` (plus identity and replay buffer when `persist`);
        `engine_fields()` runs on the engine thread (see `Scheduler.snapshot`)."""

        def extra() -> dict:
            out = fields()
            if persist:
                out.update(self.persist_fields())
            return out

        return await self.m.scheduler.snapshot(slot, extra, engine_fields)

    @property
    def settings(self) -> Settings:
        return self.store.ctx.settings

    async def fail(self, conn: Conn | None, code: str, message: str) -> Closed:
        """Error to the client (if connected), then close the session for good; returns the
        Closed to raise."""
        err = Closed(code)
        if conn is not None:
            err = await conn.fail(code, message)
        else:
            self.store.ctx.metrics.evictions.labels(self.m.name, code).inc()
        await self.store.finish(self, code)
        return err

    # ---- implemented by the kinds
    def ready(self) -> dict[str, Any]:
        """The `ready` message of a new session (kinds add their fields)."""
        return {
            "type": "ready",
            "session_id": self.sid,
            "resume_token": self.token,
            "model": self.m.name,
        }

    def resume_info(self) -> dict[str, Any]:
        raise NotImplementedError

    async def binary(self, conn: Conn, data: bytes) -> None:
        """A binary message on the session's connection."""
        raise await self.fail(conn, "invalid_message", "this endpoint takes JSON text messages")

    async def handle(self, conn: Conn, msg: Any) -> bool:
        """A parsed message other than start/resume; False when the session is over."""
        raise NotImplementedError

    async def wait_turn(self) -> None:
        """Wait for running work that must finish before the next message (text turns)."""

    def busy(self) -> bool:
        """Accepted work is still producing messages (the drain waits for it)."""
        return False

    def cancel(self) -> None:
        """Stop running work at the next batch boundary (drain, client gone)."""

    async def export(self, persist: bool = False) -> bytes:
        raise NotImplementedError

    async def release(self) -> None:
        """Free the slot and everything else the session holds."""
        raise NotImplementedError

    def log_extra(self) -> dict[str, Any]:
        return {}


class SessionStore:
    """Every live WebSocket session of the server, by id."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.live: dict[str, LiveSession] = {}
        self._bg: set[asyncio.Task] = set()

    def register(self, sess: LiveSession) -> LiveSession:
        """Count and keep a new session: from here on it owns its slot (`finish` frees it)."""
        self.ctx.session_started(sess.m, sess.kind, sess.sid)
        self.live[sess.sid] = sess
        return sess

    def verify(self, sid: Any, token: Any) -> LiveSession | None:
        """The session with this id if `token` is its resume token (constant-time check)."""
        sess = self.live.get(sid) if isinstance(sid, str) else None
        expect = sess.token_hash if sess is not None else b"\0" * 32
        ok = hmac.compare_digest(hash_token(token if isinstance(token, str) else ""), expect)
        return sess if sess is not None and ok and not sess.closed else None

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def detach(self, sess: LiveSession) -> None:
        """The connection is gone: keep the session for `resume_grace_s` (or close it)."""
        if sess.closed or sess.detached_since is not None:
            return
        sess.conn = None
        if self.ctx.draining:  # the drain persists it
            return
        grace = self.ctx.settings.resume_grace_s
        if grace <= 0:
            self.spawn(self.finish(sess, "client_gone"))
            return
        sess.detached_since = time.perf_counter()
        self.ctx.metrics.detached.inc()
        sess._expiry = asyncio.get_running_loop().create_task(self._expire(sess, grace))

    async def _expire(self, sess: LiveSession, grace: float) -> None:
        await asyncio.sleep(grace)
        self.ctx.metrics.evictions.labels(sess.m.name, "resume_expired").inc()
        await self.finish(sess, "resume_expired")

    def _undetach(self, sess: LiveSession) -> None:
        if sess._expiry is not None and sess._expiry is not asyncio.current_task():
            sess._expiry.cancel()
        sess._expiry = None
        if sess.detached_since is not None:
            sess.detached_since = None
            self.ctx.metrics.detached.dec()

    async def attach(self, sess: LiveSession, conn: Conn, last_seq: int) -> None:
        """Give the session a new connection; re-send the kept messages after `last_seq`."""
        self._undetach(sess)
        old = sess.conn
        sess.conn = None
        if old is not None and old is not conn:  # a stale connection still holds it
            self.spawn(old.close(1008, "session_resumed_elsewhere"))
        while True:
            pending = sess.outbox.since(last_seq)
            if not pending:
                break
            for msg in pending:
                await conn.send(msg)
                last_seq = msg["seq"]
                sess.sent_seq = max(sess.sent_seq, last_seq)
        sess.conn = conn  # no await since the last check: nothing emitted in between is lost

    async def finish(self, sess: LiveSession, reason: str) -> None:
        """Close the session for good: free its slot, log its end."""
        if sess.closed:
            return
        sess.closed = True
        self.live.pop(sess.sid, None)
        self._undetach(sess)
        sess.conn = None
        with contextlib.suppress(Exception):
            await sess.release()
        self.ctx.session_ended(sess.sid, sess.m, sess.kind, sess.t0, reason, **sess.log_extra())


@asynccontextmanager
async def owned_slot(m: ModelEntry) -> AsyncIterator[int]:
    """Take a state slot of `m` (PoolFullError when none is free). Any exception inside the
    block gives the slot back; leaving it normally hands the slot to what was registered in it
    (a session, whose `finish` frees it). Example:

        async with owned_slot(m) as slot:
            store.register(SpeechSession(store, m, ..., slot))
    """
    slot = await m.scheduler.open_slot()
    try:
        yield slot
    except BaseException:
        m.scheduler.release(slot)  # does not await: safe while being cancelled
        raise


def get_store(conn: HTTPConnection) -> SessionStore:
    return conn.app.state.sessions


StoreDep = Annotated[SessionStore, Depends(get_store)]
