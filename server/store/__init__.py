"""Session state that outlives a process: stores, the parked tier, write-behind, signing.

How the server uses this package (one `StateStore`, one `ParkedCache`, one
`CheckpointWriter` and one `StateSigner` per app, built in `create_app` from settings):

    store = await open_store(settings.state_store, StoreLimits(max_entries, max_bytes, ttl_s),
                             check=False)            # DLR_STATE_STORE: memory | dir:PATH | redis://
    writer = CheckpointWriter(store, WriterConfig(...), on_evict=notify_client); writer.start()
    parked = ParkedCache(store, max_bytes=parked_ram_bytes, writer=writer)
    signer = StateSigner.from_env()                  # DLR_STATE_SECRET (same on every replica)

- Every blob that reaches the store, the parked tier or a client is signed: `signer.sign(
  engine_snapshot, model, model_hash=engine.config_hash, state_version=SNAPSHOT_VERSION,
  ttl_s=..., sid=...)`. Every blob that comes back (import body, resume, store read) is
  verified first: `signer.verify(blob, model_hash, SNAPSHOT_VERSION, max_payload_bytes)` ->
  `Verified(header, payload)`, or `EnvelopeError` whose `.reason` names the refusal and
  `.status` is the HTTP status to answer (400 / 409 wrong model / 410 expired / 413).
  Only then is the payload given to `engine.restore`.
- Park (idle past a threshold, or a slot is needed): sign the slot's snapshot at a safe point,
  `await parked.park(sid, blob, ttl_s)`, free the slot. Restore (next message or resume of a
  parked session): `r = await parked.restore(sid)` (RAM, then the writer's backlog, then the
  store); None means expired or evicted: answer as for an unknown session.
- Checkpoint at safe points (after each finished text turn; a speech stream every
  `DLR_CHECKPOINT_AUDIO_S` of audio and at `end`), with the resume sequence numbers in the
  snapshot's extra: `writer.submit(sid, blob, ttl_s)`. It returns at once and never raises;
  the write happens in batches off the engine's path, coalesced per session. A session that
  ends: `parked.discard(sid)` and `writer.submit_delete(sid)`.
- At start-up (crash recovery): `await store.list()` names the stored sessions; each is
  verified and restored (or left parked in the store until its client resumes).
- Readiness and metrics: `writer.degraded` / `writer.reason` for /readyz (live sessions keep
  working while the store is down); `await store.stats()`, `writer.stats()`,
  `parked.stats()` for gauges and counters. `on_evict(Evicted)` is called for every session
  the store removed for its quotas or TTL: tell its client if one is connected.
- With the `memory` store the parked RAM tier only duplicates it: give it 0 bytes there.
- Ids are uuid4 hex (`check_id`); anything else is refused before it can name a file or key.
"""

from .base import (
    Entry,
    EntryInfo,
    Evicted,
    EvictReason,
    InvalidId,
    Latency,
    PutItem,
    PutResult,
    StateStore,
    StoreError,
    StoreLimits,
    StoreStats,
    StoreUnavailable,
    ValueTooLarge,
    check_id,
)
from .dirstore import DirStore
from .factory import open_store, parse_store_url
from .memory import MemoryStore
from .parking import ParkedCache, ParkedStats, ParkResult, Restored, Tier
from .signing import EnvelopeError, EnvelopeHeader, Reason, StateSigner, Verified
from .writer import CheckpointWriter, PendingWrite, WriterConfig, WriterStats

__all__ = [
    "CheckpointWriter",
    "EnvelopeError",
    "EnvelopeHeader",
    "ParkResult",
    "ParkedCache",
    "ParkedStats",
    "PendingWrite",
    "Reason",
    "Restored",
    "StateSigner",
    "Tier",
    "Verified",
    "WriterConfig",
    "WriterStats",
    "DirStore",
    "Entry",
    "EntryInfo",
    "EvictReason",
    "Evicted",
    "InvalidId",
    "Latency",
    "MemoryStore",
    "PutItem",
    "PutResult",
    "StateStore",
    "StoreError",
    "StoreLimits",
    "StoreStats",
    "StoreUnavailable",
    "ValueTooLarge",
    "check_id",
    "open_store",
    "parse_store_url",
]
