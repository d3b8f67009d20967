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

Durable sessions (server/durable.py; a store other than memory): a session writes a signed
checkpoint (its state, id, token hash, outbox and position) at its safe points
(`checkpoint()`); once the store confirms it, the client gets `{"type":"checkpoint", ...
position}` (unnumbered), so it keeps what it sent after that for a resend. A resume of an
id this process does not hold goes to `SessionStore.recover` (set by the app): the session is
rebuilt from the store, on this process or any replica sharing it.

Ownership: a state slot is taken inside `owned_slot(m)`, whose failure path always gives it back;
once a session is registered (`SessionStore.register`) the session owns the slot and
`SessionStore.finish` frees it. The store is built by `create_app` and reached by routes through
`StoreDep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import HTTPConnection

from dlr_runtime.engine import PoolFullError, SnapshotError
from dlr_runtime.engine.snapshot import read_header

from ..admission import pool_full
from ..context import AppContext
from ..errors import Closed
from ..registry import ModelEntry
from ..settings import Settings
from ..store import EnvelopeError, Evicted
from ..ws import Conn
from .tokens import issue, new_secret, open_token, secret_hash

log = logging.getLogger("dlr.server")


def hash_token(ctx: AppContext, sid: object, token: object) -> bytes:
    """The sha256 of the secret in a valid resume token of `sid` (TokenRefused otherwise)."""
    return secret_hash(open_token(ctx, sid, token))


class ResumeMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str
    session_id: str = Field(max_length=64)
    resume_token: str = Field(max_length=1024)  # (a signed token: sessions/tokens.py)
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
        if token_hash is None:  # (a signed token around a new secret: sessions/tokens.py)
            secret = new_secret()
            self.token = issue(store.ctx, m, self.sid, secret)
            token_hash = secret_hash(secret)
        self.token_hash = token_hash
        self.outbox = outbox or Outbox(settings.resume_buffer_messages)
        self.sent_seq = sent_seq  # highest seq whose send succeeded
        self.conn: Conn | None = None
        self.closed = False
        self.end_reason = ""  # why `finish` closed it
        self.completed = False  # its work is over; only a final message may await replay
        self.t0 = time.perf_counter()
        self.detached_since: float | None = None
        self.detached_from = ""  # the client address whose connection dropped it
        self._expiry: asyncio.Task | None = None
        self.parked = False  # its state is in the parked tier, it holds no slot
        self.idle_since = time.monotonic()  # end of its last turn (parking picks the oldest)

    # ---- durable checkpoints
    position_keys: tuple[str, ...] = ()  # fields of a snapshot's extra the client is told

    async def checkpoint(self) -> bool:
        """Write a sealed checkpoint through (off the engine's path); False when not written
        (no durable store, the session is closed or cannot be exported now)."""
        d = self.store.ctx.durable
        if d is None or not d.checkpoints or self.closed:
            return False
        try:
            blob = await self.export(persist=True)
        except (SnapshotError, RuntimeError) as e:
            log.debug("checkpoint of %s skipped: %s", self.sid, e)
            return False
        if self.closed:  # ended while its snapshot was taken: nothing to keep
            return False
        extra = read_header(blob).get("extra") or {}
        position = {k: extra[k] for k in self.position_keys if k in extra}
        return d.checkpoint(self.sid, d.seal(self.m, blob, self.sid), tag=position)

    def checkpointed(self, position: dict[str, Any]) -> None:
        """The store confirmed a checkpoint: tell the connected client (best effort)."""
        conn = self.conn
        if conn is not None and position and not self.closed:
            self.store.spawn(_send_quietly(conn, {"type": "checkpoint", **position}))

    # ---- parking (text sessions between turns, idle speech streams; see TextLive, SpeechSession)
    def parkable(self) -> bool:
        return False

    async def park(self) -> bool:
        """Seal the state into the parked tier and free the slot; False when not now."""
        return False

    def parked_in_time(self) -> bool:
        """After `park` stored the state: True when the session may now give up its slot;
        False when it was finished meanwhile (its slot is then already freed, and the state
        just stored is dropped unless the end keeps it)."""
        if not self.closed:
            return True
        d = self.store.ctx.durable
        if d is not None and self.end_reason not in KEEP_STATE:
            d.forget(self.sid)
        return False

    async def parked_state(self) -> bytes:
        """The engine snapshot a parked session left (with its identity fields)."""
        d = self.store.ctx.durable
        r = await d.load(self.sid) if d is not None else None
        if r is None:
            raise SnapshotError("the parked session state was lost")
        try:
            return d.unseal(r.data, self.m, self.sid).payload
        except EnvelopeError as e:
            raise SnapshotError(f"parked state refused: {e}") from None

    async def parked_slot(self, conn: Conn | None) -> tuple[int, bytes]:
        """For an unpark: a slot and the verified parked snapshot to restore into it (the
        caller gives the slot back if that fails). No state: the session fails
        (`state_lost`); no slot and none to free: it stays parked and the client is refused."""
        d = self.store.ctx.durable
        assert d is not None
        r = await d.load(self.sid)
        if r is None:
            raise await self.fail(conn, "state_lost", "the parked session state was lost")
        try:
            payload = d.unseal(r.data, self.m, self.sid).payload
        except EnvelopeError as e:
            raise await self.fail(conn, "state_lost", f"parked state refused: {e}") from None
        slot = await self.store.take_slot(self.m)
        if slot is None:  # (the client may resume later)
            await d.park(self.sid, r.data)
            raise (
                await conn.refuse(pool_full(self.store.ctx, self.m))
                if conn
                else Closed("overloaded")
            )
        return slot, payload

    def counted(self, delta: int) -> None:
        """A parked session holds no slot: it does not count against the session caps."""
        self.m.sessions += delta
        self.store.ctx.sessions += delta
        self.store.ctx.metrics.parked_sessions.dec(delta)
        self.store.slotted(self, delta > 0)

    def resync(self, client_seq: int) -> None:
        """The client saw messages up to `client_seq`, past this (restored) outbox: a session
        whose redone messages may differ from the lost ones numbers new ones after it."""

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
            **self.durability(),
        }

    def durability(self) -> dict[str, Any]:
        """`checkpoints: true` when the session survives a server crash (clients then keep
        what they sent until a `checkpoint` message covers it)."""
        d = self.store.ctx.durable
        return {"checkpoints": True} if d is not None and d.checkpoints else {}

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

    def in_turn(self) -> bool:
        """A client message is being handled (the drain waits for it before quiescing)."""
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


async def _send_quietly(conn: Conn, msg: dict[str, Any]) -> None:
    with contextlib.suppress(Closed):
        await conn.send(msg)


ROOM_WAIT_S = 0.25  # a full model waits this long for a session to become parkable
KEEP_STATE = ("drained", "parked", "superseded")  # ends after which the stored state stays
Recover = Callable[[str, str], Awaitable["LiveSession | None"]]
Superseded = Callable[["LiveSession"], Awaitable[bool]]


class SessionStore:
    """Every live WebSocket session of the server, by id."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.live: dict[str, LiveSession] = {}
        # the live sessions that hold a slot (not parked): parking scans only these, so a
        # server holding 100k parked sessions picks one to park in O(slots), not O(sessions)
        self.holding: dict[str, LiveSession] = {}
        # detached sessions by client address (the per-client cap counts only these)
        self._detached: dict[str, dict[str, LiveSession]] = {}
        self._bg: set[asyncio.Task] = set()
        # (sid, token) -> a session rebuilt from the durable store, or None (set by the app)
        self.recover: Recover | None = None
        # detached session -> whether the store holds a newer checkpoint of it (set by the app)
        self.superseded: Superseded | None = None

    # ---- parking
    def slotted(self, sess: LiveSession, holds: bool) -> None:
        """`sess` took a slot again (`holds`) or was parked (its slot freed)."""
        if holds and sess.sid in self.live:
            self.holding[sess.sid] = sess
        else:
            self.holding.pop(sess.sid, None)

    async def make_room(self, m: ModelEntry, wait_s: float = ROOM_WAIT_S) -> bool:
        """Park the longest-idle parkable session of model `m`; False when there is none,
        after waiting up to `wait_s` for one (a turn that just sent its `done` is busy for a
        few ms more: its checkpoint is being taken)."""
        deadline = time.monotonic() + wait_s
        while True:
            idle = [x for x in self.holding.values() if x.m is m and x.parkable()]
            if not idle:
                if time.monotonic() >= deadline or not any(
                    x.m is m and x.kind == "text" and not x.parked for x in self.holding.values()
                ):
                    return False
                await asyncio.sleep(0.01)
                continue
            if await min(idle, key=lambda x: x.idle_since).park():
                self.ctx.metrics.evictions.labels(m.name, "parked_for_room").inc()
                return True

    async def take_slot(self, m: ModelEntry) -> int | None:
        """A free slot of `m`, parking an idle session for it if needed (None: none)."""
        while True:
            try:
                return await m.scheduler.open_slot()
            except PoolFullError:
                if not await self.make_room(m):
                    return None

    async def park_idle(self, every_s: float) -> None:
        """Forever: park sessions idle longer than `park_after_idle_s`."""
        after = self.ctx.settings.park_after_idle_s
        while True:
            await asyncio.sleep(every_s)
            now = time.monotonic()
            for sess in list(self.holding.values()):
                if sess.parkable() and now - sess.idle_since >= after:
                    with contextlib.suppress(Exception):
                        if await sess.park():
                            self.ctx.metrics.evictions.labels(sess.m.name, "parked_idle").inc()

    def evicted(self, ev: Evicted) -> None:
        """The store dropped `ev.key` for its quotas or TTL: tell its client if connected."""
        sess = self.live.get(ev.key)
        if sess is not None and sess.conn is not None:
            msg = {
                "type": "warning",
                "code": "state_evicted",
                "message": f"the stored state of this session was evicted ({ev.reason}); "
                "it survives a server restart only after its next checkpoint",
            }
            self.spawn(_send_quietly(sess.conn, msg))

    def written(self, sid: str, position: object) -> None:
        """The durable store confirmed a checkpoint of `sid` (the writer's callback)."""
        sess = self.live.get(sid)
        if sess is not None and isinstance(position, dict):
            sess.checkpointed(position)

    def register(self, sess: LiveSession) -> LiveSession:
        """Count and keep a new session: from here on it owns its slot (`finish` frees it)."""
        self.ctx.session_started(sess.m, sess.kind, sess.sid)
        self.live[sess.sid] = sess
        self.holding[sess.sid] = sess
        return sess

    def verify(self, sid: Any, token: Any) -> LiveSession | None:
        """The session with this id if `token` is its resume token (constant-time check);
        None when no such session is here. Raises TokenRefused (its `reason`: unsigned,
        bad_signature, wrong_model, wrong_session, expired, ...) for a token that is not a
        valid signed token of `sid`."""
        digest = hash_token(self.ctx, sid, token)
        sess = self.live.get(sid)
        expect = sess.token_hash if sess is not None else b"\0" * 32
        ok = hmac.compare_digest(digest, expect)
        return sess if sess is not None and ok and not sess.closed else None

    def renewed_token(self, sess: LiveSession, token: str) -> str:
        """A fresh token (new expiry) around the secret of `token`, already verified."""
        return issue(self.ctx, sess.m, sess.sid, open_token(self.ctx, sess.sid, token))

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def detach(self, sess: LiveSession) -> None:
        """The connection is gone: keep the session for `resume_grace_s` (or close it)."""
        if sess.closed or sess.detached_since is not None:
            return
        client = getattr(sess.conn.ws, "client", None) if sess.conn is not None else None
        sess.conn = None
        if self.ctx.draining:  # the drain persists it
            return
        grace = self.ctx.settings.resume_grace_s
        if grace <= 0:
            self.spawn(self.finish(sess, "client_gone"))
            return
        sess.detached_since = time.perf_counter()
        sess.detached_from = client.host if client is not None else ""
        self.ctx.metrics.detached.inc()
        sess._expiry = asyncio.get_running_loop().create_task(self._expire(sess, grace))
        self._detached.setdefault(sess.detached_from, {})[sess.sid] = sess
        self._cap_detached(sess.detached_from)

    def _cap_detached(self, client: str) -> None:
        """One client address keeps at most `max_detached_per_client` dropped sessions: its
        oldest beyond that are closed now (eviction reason `detached_cap`), so a client that
        drops connections on purpose cannot hold every slot for the resume grace."""
        cap = self.ctx.settings.max_detached_per_client
        if cap <= 0 or not client:
            return
        mine = [
            x
            for x in self._detached.get(client, {}).values()
            if x.detached_since is not None and not x.closed
        ]
        mine.sort(key=lambda x: x.detached_since or 0.0)
        for old in mine[: max(0, len(mine) - cap)]:
            self._undetach(old)  # (counted out now; finish completes it)
            self.ctx.metrics.evictions.labels(old.m.name, "detached_cap").inc()
            self.spawn(self.finish(old, "detached_cap"))

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
            mine = self._detached.get(sess.detached_from)
            if mine is not None:
                mine.pop(sess.sid, None)
                if not mine:
                    del self._detached[sess.detached_from]

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
        sess.end_reason = reason
        self.live.pop(sess.sid, None)
        self.holding.pop(sess.sid, None)
        self._undetach(sess)
        sess.conn = None
        if self.ctx.durable is not None and reason not in KEEP_STATE:
            self.ctx.durable.forget(sess.sid)
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
