"""One WebSocket handler skeleton for every session kind (speech and text).

`serve(ws, store, kind)` runs a connection: handshake and admission, then each message is a
`start` (a new session; a running one is finished first), a `resume` (first message only), or
handed to the session (`LiveSession.binary` / `.handle`); once a drain has quiesced the
server, messages are held instead (server/drain.py). The kind (`SessionKind`) says how to
parse messages and build its session.

Ownership, structurally:
- a session is attached to its connection (and registered) *before* `ready` is sent; if `ready`
  cannot be delivered the client never learnt the resume token, so the session ends at once;
- whatever ends the connection (an error, a clean close, a reset, a cancelled handler) goes
  through `connection_over` exactly once, which detaches the session for resume (a dropped
  link, a stopping server) or finishes it, freeing its slot. There is no early return on a
  failed send: start-then-close can never leak a session or a slot.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket
from pydantic import TypeAdapter, ValidationError

from dlr_runtime.engine import PoolFullError

from ..admission import model_full, pool_full, refusal
from ..errors import Closed, NoModelError, validation_message
from ..registry import ModelEntry
from ..ws import Conn
from .store import LiveSession, ResumeMessage, SessionStore, owned_slot
from .tokens import TokenRefused


@dataclass(frozen=True)
class SessionKind:
    name: str  # session kind: "speech" | "text"
    model_kind: str  # model kind it needs: "speech" | "lm"
    parse: TypeAdapter  # the endpoint's client messages (a discriminated union on "type")
    # build a session around a fresh slot (sync or async), from the start message
    create: Callable[[SessionStore, ModelEntry, int, Any], Awaitable[LiveSession]]
    no_session: str  # error message for a non-start message before any session
    early_binary: tuple[str, str]  # (code, message) for a binary message before any session


async def serve(ws: WebSocket, store: SessionStore, kind: SessionKind) -> None:
    ctx = store.ctx
    conn = Conn(ws, ctx.settings, ctx.metrics)
    sess: LiveSession | None = None
    err: Closed | None = None
    try:
        await conn.accept()
        await room_for(store, kind.model_kind)
        r = refusal(ctx, kind=kind.model_kind)
        if r is not None:
            raise await conn.refuse(r)
        while True:
            text, data = await conn.receive()
            if sess is not None and ctx.quiesced:
                await held(store)
            if data is not None:
                if sess is None:
                    raise await conn.fail(*kind.early_binary)
                await sess.binary(conn, data)
                continue
            obj = await conn.receive_json(text or "")
            if obj.get("type") == "resume":
                if sess is not None:
                    raise await conn.fail("invalid_message", "resume must open a connection")
                sess = await resume(store, conn, obj, kind.name)
                continue  # None: it had completed and its final was re-sent
            try:
                msg = kind.parse.validate_python(obj)
            except ValidationError as e:
                raise await conn.fail("invalid_message", validation_message(e)[1]) from None
            if msg.type == "start":
                if sess is not None:
                    await sess.wait_turn()
                    await store.finish(sess, "restarted")
                    sess = None
                sess = await start(store, conn, kind, msg)
                continue
            if sess is None:
                if conn.last_final is not None:  # an end re-sent after a resume
                    await conn.send(conn.last_final)
                    conn.last_final = None
                    continue
                raise await conn.fail("no_session", kind.no_session.format(type=msg.type))
            await sess.wait_turn()
            if sess.closed or sess.conn is not conn:
                raise Closed("taken_over")
            if not await sess.handle(conn, msg):
                sess = None
    except Closed as e:
        err = e
    finally:  # err None: the handler was cancelled (the server is stopping)
        await connection_over(store, conn, sess, err)


async def held(store: SessionStore) -> None:
    """The drain has quiesced the server: the message just received is not handled (the
    session's resume position says so); wait until the drain has told this connection's
    client `going_away`, then end the connection (the drain detached the session)."""
    await store.ctx.drained.wait()
    raise Closed("going_away", by_client=True, code=1001)


async def room_for(store: SessionStore, model_kind: str) -> None:
    """Every model of the kind is at its session cap: park an idle session of one of them
    (a parked session holds no slot and does not count) rather than refuse."""
    models = [m for m in store.ctx.models.values() if m.kind == model_kind]
    if models and all(model_full(store.ctx, m) for m in models):
        for m in models:
            if await store.make_room(m):
                return


async def start(store: SessionStore, conn: Conn, kind: SessionKind, msg: Any) -> LiveSession:
    """Pick the model, check admission, take a slot, build + register + attach the session,
    then send `ready` (errors close `conn`; nothing is left behind on any failure)."""
    ctx = store.ctx
    try:
        m = ctx.pick_model(msg.model, kind.model_kind)
    except NoModelError as e:
        raise await conn.fail("unknown_model", str(e)) from None
    conn.model = m.name
    while True:  # the room parking made may go to a concurrent start: then park another
        # park an idle session rather than refuse (the pool may also be full of slots held
        # by HTTP generations or streams)
        parked = False
        if model_full(ctx, m) or not m.engine.pool.available:
            parked = await store.make_room(m)
        if parked and (model_full(ctx, m) or not m.engine.pool.available):
            continue
        r = refusal(ctx, model=m)
        if r is not None:
            raise await conn.refuse(r)
        try:
            async with owned_slot(m) as slot:
                sess = store.register(await kind.create(store, m, slot, msg))
        except PoolFullError:
            if await store.make_room(m):
                continue
            raise await conn.refuse(pool_full(ctx, m)) from None
        except ValueError as e:  # a start the session cannot honour (e.g. its sample rate)
            raise await conn.fail("invalid_message", str(e)) from None
        break
    sess.conn = conn  # attached before ready: a failed send below detaches or finishes it
    try:
        await conn.send(sess.ready())
    except BaseException:
        await store.finish(sess, "client_gone")  # it never got its resume token
        raise
    await sess.checkpoint()  # (durable store: resumable after a crash from here on)
    return sess


async def resume(
    store: SessionStore, conn: Conn, obj: dict[str, Any], kind: str
) -> LiveSession | None:
    """Handle a `resume` message: attach the session to `conn` and replay; returns the
    session, or None when it had already completed (its final was replayed)."""
    metrics = store.ctx.metrics
    try:
        msg = ResumeMessage.model_validate(obj)
    except ValidationError as e:
        raise await conn.fail("invalid_message", validation_message(e)[1]) from None
    try:
        sess = store.verify(msg.session_id, msg.resume_token)
    except TokenRefused as e:  # not a valid signed token of this session: say why
        metrics.rejections.labels(f"resume_token_{e.reason}").inc()
        raise await conn.fail("invalid_resume", str(e), reason=e.reason) from None
    stale = store.superseded
    if sess is not None and sess.conn is None and stale is not None and await stale(sess):
        await store.finish(sess, "superseded")  # another process moved it on: take the newer
        sess = None
    if sess is None and store.recover is not None:  # not here: rebuild it from the store
        sess = await store.recover(msg.session_id, msg.resume_token)
    if sess is None or sess.kind != kind:
        metrics.rejections.labels("resume_refused").inc()
        raise await conn.fail(
            "invalid_resume",
            "unknown session id or wrong resume token (the session may have expired)",
        )
    conn.model = sess.m.name
    if msg.last_seq is not None and msg.last_seq > sess.outbox.seq:  # restored from a checkpoint
        sess.resync(msg.last_seq)
    last = sess.sent_seq if msg.last_seq is None else min(msg.last_seq, sess.outbox.seq)
    await conn.send(
        {
            "type": "ready",
            "resumed": True,
            "session_id": sess.sid,
            "resume_token": store.renewed_token(sess, msg.resume_token),
            "model": sess.m.name,
            "last_seq": sess.outbox.seq,
            "replay_from": last + 1,
            "replay_truncated": sess.outbox.truncated(last),
            **sess.durability(),
            **sess.resume_info(),
        }
    )
    await store.attach(sess, conn, last)
    metrics.resumes.labels(kind, "reconnect").inc()
    if sess.completed:
        conn.last_final = next((m for m in reversed(sess.outbox.buf) if m["type"] == "final"), None)
        await store.finish(sess, "completed")
        return None
    return sess


async def connection_over(
    store: SessionStore, conn: Conn, sess: LiveSession | None, err: Closed | None
) -> None:
    """The connection ended (`err`: its Closed, None when cancelled): a dropped link (or a
    stopping server) detaches the session for resume, anything else ends it. A session that
    was resumed on another connection meanwhile belongs to that one and is left alone."""
    if sess is None or sess.closed or sess.conn is not conn:
        return
    if err is None or err.resumable or sess.parked:  # (parked: its state waits for a resume)
        store.detach(sess)
        return
    sess.cancel()
    await store.finish(sess, str(err) or "client_closed")
