"""Stored responses of `POST /v1/responses`: the state a follow-up continues from.

A stored response is the engine snapshot of its slot once the reply ended (the state after the
prompt and every fed reply token), with the tokens sampled but not yet fed (`pending`: the
last one; at most one) and the response object in the snapshot's extra. A follow-up
(`previous_response_id`) restores it into a fresh slot and feeds `pending` + its own new input
only, so a turn costs the same however long the conversation is.

Signed like every stored snapshot: `save` seals the snapshot in the app's HMAC envelope
(`DLR_STATE_SECRET`; server/store/signing.py) bound to the response id and expiring after
`response_ttl_s`; `load` verifies it (signature, model content hash, snapshot format, the
id, expiry) before anything of it is read or restored. A blob that fails is refused like an
unknown id (404), logged and counted (`dlr_state_store_failures_total{op="refused"}`).

Where they live: the durable state store when it outlives the process (`DLR_STATE_STORE`
`dir:` or `redis://`, shared with session checkpoints): stored responses then survive a
restart and are seen by every replica with the same secret. With the in-process `memory`
state store they go to one in-memory store per app bounded by `response_store_mb` instead.
Every entry expires after `response_ttl_s`. `response_store(ctx)` is the one place that picks
it. Keys are the hex part of the response id ("resp_<32 hex>").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from dlr_runtime.engine import SNAPSHOT_VERSION, SnapshotError
from dlr_runtime.engine.snapshot import read_header

from ..context import AppContext
from ..registry import ModelEntry
from ..store import EnvelopeError, MemoryStore, StateStore, StoreLimits, check_id
from .choices import StartState
from .restore import unseal

log = logging.getLogger("dlr.responses")

KEY = "response_object"  # the snapshot extra's key that marks a stored response (no `kind`:
# `POST /v1/sessions` refuses such a blob as carrying no session)


def response_store(ctx: AppContext) -> StateStore:
    """The store of this app's responses (created on first use when the app has none)."""
    d = ctx.durable
    if d is not None and d.checkpoints:  # dir: or redis://: outlives the process
        return d.store
    mine = getattr(ctx, "_response_store", None)
    if mine is None:
        s = ctx.settings
        limits = StoreLimits(max_bytes=int(s.response_store_mb * 2**20), ttl_s=s.response_ttl_s)
        mine = MemoryStore(limits)
        ctx._response_store = mine  # type: ignore[attr-defined]
    return mine


def key_of(response_id: str) -> str | None:
    """The store key of a response id, or None when it is not one of ours."""
    if not response_id.startswith("resp_"):
        return None
    key = response_id[len("resp_") :]
    try:
        return check_id(key)
    except ValueError:
        return None


@dataclass
class StoredResponse:
    model: str
    response: dict[str, Any]  # the response object as JSON
    start: StartState  # the state to continue from


def seal(ctx: AppContext, m: ModelEntry, response_id: str, snapshot: bytes) -> bytes:
    """The signed envelope of a response's snapshot (bound to its id, expiring with it)."""
    if ctx.durable is None:
        raise RuntimeError("the server is not ready (no state signer)")
    return ctx.durable.signer.sign(
        snapshot,
        m.name,
        m.engine.config_hash,
        SNAPSHOT_VERSION,
        ctx.settings.response_ttl_s,
        response_id,
    )


async def save(ctx: AppContext, m: ModelEntry, response_id: str, snapshot: bytes) -> None:
    key = key_of(response_id)
    assert key is not None, response_id
    blob = seal(ctx, m, response_id, snapshot)
    await response_store(ctx).put(key, blob, ttl_s=ctx.settings.response_ttl_s)


async def load(ctx: AppContext, response_id: str) -> StoredResponse | None:
    """The stored response (None when unknown, expired or deleted)."""
    key = key_of(response_id)
    if key is None:
        return None
    entry = await response_store(ctx).get(key)
    if entry is None:
        return None
    try:
        payload = unseal(ctx, entry.data, response_id).payload
        header = read_header(payload)
        extra = header.get("extra") or {}
        if not isinstance(extra.get(KEY), dict):
            raise SnapshotError("the snapshot holds no response object")
        pending = [int(t) for t in extra.get("pending") or []]
    except (EnvelopeError, SnapshotError, TypeError, ValueError) as e:
        log.warning("stored response %s refused: %s", response_id, e)
        ctx.metrics.store_failures.labels("refused").inc()
        return None
    return StoredResponse(header["model"], extra[KEY], StartState(payload, pending))


async def delete(ctx: AppContext, response_id: str) -> bool:
    key = key_of(response_id)
    return key is not None and await response_store(ctx).delete(key)


def extra_of(pending: list[int], response: dict[str, Any]) -> dict[str, Any]:
    return {"pending": list(pending), KEY: response}
