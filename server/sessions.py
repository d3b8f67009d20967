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
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import validation_message

if TYPE_CHECKING:
    from .registry import ModelEntry
    from .routes.wsutil import Conn
    from .state import ServerState

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
        st: ServerState,
        m: ModelEntry,
        sid: str | None = None,
        token_hash: bytes | None = None,
        outbox: Outbox | None = None,
        sent_seq: int = 0,
    ) -> None:
        self.st, self.m = st, m
        self.sid = sid or uuid.uuid4().hex
        self.token: str | None = None  # given to the client once, never stored in clear
        if token_hash is None:
            self.token = secrets.token_urlsafe(32)
            token_hash = hash_token(self.token)
        self.token_hash = token_hash
        self.outbox = outbox or Outbox(st.settings.resume_buffer_messages)
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
        from .routes.wsutil import Closed

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

    async def snapshot(self, slot: int, fields, persist: bool) -> bytes:
        """The slot's state with `fields()` (plus identity and replay buffer when `persist`)."""

        def extra() -> dict:
            out = fields()
            if persist:
                out.update(self.persist_fields())
            return out

        return await self.m.scheduler.snapshot(slot, extra)

    # ---- implemented by the kinds
    def resume_info(self) -> dict[str, Any]:
        raise NotImplementedError

    async def export(self, persist: bool = False) -> bytes:
        raise NotImplementedError

    async def release(self) -> None:
        """Free the slot and everything else the session holds."""
        raise NotImplementedError

    def log_extra(self) -> dict[str, Any]:
        return {}


class SessionStore:
    """Every live WebSocket session of the server, by id."""

    def __init__(self, st: ServerState) -> None:
        self.st = st
        self.live: dict[str, LiveSession] = {}
        self._bg: set[asyncio.Task] = set()

    def add(self, sess: LiveSession) -> None:
        self.live[sess.sid] = sess

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
        if self.st.draining:  # the drain persists it
            return
        grace = self.st.settings.resume_grace_s
        if grace <= 0:
            self.spawn(self.finish(sess, "client_gone"))
            return
        sess.detached_since = time.perf_counter()
        self.st.metrics.detached.inc()
        sess._expiry = asyncio.get_running_loop().create_task(self._expire(sess, grace))

    async def _expire(self, sess: LiveSession, grace: float) -> None:
        await asyncio.sleep(grace)
        self.st.metrics.evictions.labels(sess.m.name, "resume_expired").inc()
        await self.finish(sess, "resume_expired")

    def _undetach(self, sess: LiveSession) -> None:
        if sess._expiry is not None and sess._expiry is not asyncio.current_task():
            sess._expiry.cancel()
        sess._expiry = None
        if sess.detached_since is not None:
            sess.detached_since = None
            self.st.metrics.detached.dec()

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
        self.st.session_ended(sess.sid, sess.m, sess.kind, sess.t0, reason, **sess.log_extra())


async def resume(conn: Conn, obj: dict[str, Any], kind: str) -> LiveSession | None:
    """Handle a `resume` message: attach the session to `conn` and replay; returns the
    session, or None when it had already completed (its final was replayed)."""
    st = conn.st
    try:
        msg = ResumeMessage.model_validate(obj)
    except ValidationError as e:
        raise await conn.fail("invalid_message", validation_message(e)[1]) from None
    sess = st.store.verify(msg.session_id, msg.resume_token)
    if sess is None or sess.kind != kind:
        st.metrics.rejections.labels("resume_refused").inc()
        raise await conn.fail(
            "invalid_resume",
            "unknown session id or wrong resume token (the session may have expired)",
        )
    conn.model = sess.m.name
    last = sess.sent_seq if msg.last_seq is None else min(msg.last_seq, sess.outbox.seq)
    await conn.send(
        {
            "type": "ready",
            "resumed": True,
            "session_id": sess.sid,
            "model": sess.m.name,
            "last_seq": sess.outbox.seq,
            "replay_from": last + 1,
            "replay_truncated": sess.outbox.truncated(last),
            **sess.resume_info(),
        }
    )
    await st.store.attach(sess, conn, last)
    st.metrics.resumes.labels(kind, "reconnect").inc()
    if sess.completed:
        conn.last_final = next((m for m in reversed(sess.outbox.buf) if m["type"] == "final"), None)
        await st.store.finish(sess, "completed")
        return None
    return sess


async def open_slot(conn: Conn, model: str | None, kind: str) -> tuple[ModelEntry, int]:
    """Pick the model for a new session, check admission, take a slot (errors close `conn`)."""
    from dlr_runtime.engine import PoolFullError

    from .state import NoModelError

    st = conn.st
    try:
        m = st.pick_model(model, kind)
    except NoModelError as e:
        raise await conn.fail("unknown_model", str(e)) from None
    conn.model = m.name
    await conn.check_admission()
    try:
        return m, await m.scheduler.open_slot()
    except PoolFullError:
        st.metrics.rejections.labels("pool_full").inc()
        raise await conn.fail("overloaded", f"model {m.name!r} has no free session slot") from None


def register(conn: Conn, sess: LiveSession) -> LiveSession:
    conn.st.session_started(sess.m, sess.kind, sess.sid)
    conn.st.store.add(sess)
    return sess


async def connection_over(conn: Conn, sess: LiveSession | None, err: Exception | None) -> None:
    """A handler's connection ended (`err`: its Closed, None when cancelled): a dropped link
    (or a stopping server) detaches the session for resume, anything else ends it."""
    if sess is None or sess.closed or sess.conn is not conn:
        return
    if err is None or getattr(err, "resumable", False):
        conn.st.store.detach(sess)
        return
    cancel = getattr(sess, "cancel_generation", None)
    if cancel is not None:
        cancel()
    await conn.st.store.finish(sess, str(err) or "client_closed")
