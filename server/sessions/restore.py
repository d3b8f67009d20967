"""A session rebuilt from a state blob: `POST /v1/sessions` imports and the drain's files.

`restore_blob(store, blob, persisted)` checks the blob (sha256, model, config hash, session
kind), admission and capacity, takes a slot through `owned_slot` (any failure after that gives
the slot back) and returns a *detached* session waiting for a `resume`.

`unseal(ctx, blob)` verifies a signed envelope (server/store/signing.py) against the models
this server serves; `recover(store, sid, token)` rebuilds a session of another process (a
crashed one, or another replica) from the durable store when its client resumes here.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from dlr_runtime.engine import PoolFullError, SnapshotError
from dlr_runtime.engine.snapshot import read_header

from ..admission import Refusal, pool_full, refusal
from ..context import AppContext
from ..store import EnvelopeError, Reason, StoreError, Verified, check_id
from .kinds import CLASSES
from .store import LiveSession, Outbox, SessionStore, hash_token, owned_slot
from .tokens import TokenRefused

log = logging.getLogger("dlr.server")

# what a malformed session field raises while it is read
MALFORMED = (KeyError, TypeError, ValueError, OverflowError, AttributeError, IndexError)


class StateMismatch(Exception):
    """The blob is valid but belongs to a model (or config) this server does not serve."""


class NoCapacity(Exception):
    """No free slot or session for the restored session."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


async def restore_blob(store: SessionStore, blob: bytes, persisted: bool = False) -> LiveSession:
    """Create a detached session from a state blob. With `persisted`, the session keeps its
    id, token hash and replay buffer (a drain file); otherwise it gets new ones.

    Raises SnapshotError (malformed/tampered), StateMismatch, NoCapacity.
    """
    ctx = store.ctx
    header = read_header(blob)
    extra = header.get("extra")
    if not isinstance(extra, dict) or extra.get("kind") not in CLASSES:
        raise SnapshotError("state snapshot carries no session (extra.kind is missing)")
    m = ctx.models.get(header["model"]) if isinstance(header["model"], str) else None
    if m is None:
        raise StateMismatch(
            f"state is for model {header['model']!r}; this server serves {sorted(ctx.models)}"
        )
    if header["config_hash"] != m.engine.config_hash:
        raise StateMismatch(
            f"state is for another configuration of model {m.name!r} (config hash differs)"
        )
    cls = CLASSES[extra["kind"]]
    if (cls.kind == "speech") != (m.kind == "speech"):
        raise SnapshotError("state session kind does not match the model")
    kw: dict[str, Any] = {}
    if persisted:
        try:
            kw = {
                "sid": str(extra["session_id"]),
                "token_hash": bytes.fromhex(extra["token_sha256"]),
                "outbox": Outbox(
                    ctx.settings.resume_buffer_messages, int(extra["seq"]), list(extra["outbox"])
                ),
                "sent_seq": int(extra["sent_seq"]),
            }
        except MALFORMED as e:
            raise SnapshotError(f"persisted session fields are malformed: {e}") from e
        if kw["sid"] in store.live:
            raise SnapshotError(f"session {kw['sid']} is already live")
    r = refusal(ctx, model=m)
    if r is not None:
        raise NoCapacity(r)
    try:
        async with owned_slot(m) as slot:
            await m.scheduler.run_sync(m.engine.restore, slot, blob)
            sess = await cls.from_extra(store, m, slot, extra, **kw)
            if persisted and extra.get("completed"):
                sess.completed = True
            store.register(sess)
    except PoolFullError:
        raise NoCapacity(pool_full(ctx, m)) from None
    except MALFORMED as e:
        raise SnapshotError(f"state snapshot session fields are malformed: {e}") from e
    store.detach(sess)
    return sess


def unseal(ctx: AppContext, blob: bytes, sid: str | None = None) -> Verified:
    """The verified payload of a signed state blob of any model served here (EnvelopeError:
    `.reason` names the refusal, `.status` the HTTP status)."""
    if ctx.durable is None:
        raise EnvelopeError(Reason.MALFORMED, "the server is not ready")
    wrong: EnvelopeError | None = None
    for m in ctx.models.values():
        try:
            return ctx.durable.unseal(blob, m, sid)
        except EnvelopeError as e:
            if e.reason != Reason.WRONG_MODEL:
                raise
            wrong = e
    raise wrong or EnvelopeError(Reason.WRONG_MODEL, "this server serves no model")


async def superseded(store: SessionStore, sess: LiveSession) -> bool:
    """True when the store holds a newer checkpoint of `sess` than this process's copy: a
    process sharing the store (another worker or replica) recovered the session and moved it
    on while this one still held it detached. Resuming the local copy would lose that work."""
    ctx = store.ctx
    if ctx.durable is None or not sess.position_keys:
        return False
    try:  # the shared store only: this process's parked RAM copy is its own (and load() takes it)
        e = await ctx.durable.store.get(sess.sid)
    except StoreError:
        return False  # (store down: resume what is here, as without a store)
    if e is None:
        return False
    try:
        extra = read_header(unseal(ctx, e.data, sess.sid).payload).get("extra") or {}
    except (EnvelopeError, SnapshotError, ValueError):
        return False  # (an unreadable stored copy never replaces a live one)
    here = sess.resume_info()
    return any(
        isinstance(extra.get(k), int) and extra[k] > int(here.get(k, 0)) for k in sess.position_keys
    )


async def recover(store: SessionStore, sid: str, token: str) -> LiveSession | None:
    """The session `sid` rebuilt (detached) from its stored checkpoint if `token` is its
    resume token; None when there is none, the token is wrong or the state is refused."""
    ctx = store.ctx
    try:
        check_id(sid)
    except (StoreError, TypeError, ValueError):
        return None
    if sid in store.live:  # here already (the token did not match it)
        return None
    if ctx.durable is None or (r := await ctx.durable.load(sid)) is None:
        return None
    try:
        payload = unseal(ctx, r.data, sid).payload
        extra = read_header(payload).get("extra") or {}
        expect = bytes.fromhex(str(extra.get("token_sha256", "")))
    except (EnvelopeError, SnapshotError, ValueError) as e:
        log.warning("stored state of %s refused: %s", sid, e)
        ctx.metrics.store_failures.labels("refused").inc()
        return None
    try:
        digest = hash_token(ctx, sid, token)
    except TokenRefused:
        return None
    if len(expect) != 32 or not hmac.compare_digest(digest, expect):
        return None
    if sid in store.live:  # restored meanwhile by a concurrent resume
        return store.verify(sid, token)
    try:
        sess = await restore_blob(store, payload, persisted=True)
    except (SnapshotError, StateMismatch, NoCapacity) as e:
        log.warning("session %s not recovered: %s", sid, e)
        return store.verify(sid, token)
    ctx.metrics.resumes.labels(sess.kind, f"recovered_{r.tier}").inc()
    log.info("recovered session %s (%s) from the %s", sid, sess.kind, r.tier)
    return sess
