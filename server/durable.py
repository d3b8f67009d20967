"""Durable sessions: the state store, checkpoints, the parked tier and signed state of one app.

`Durable.open(settings, metrics)` (in `create_app`'s lifespan) opens the store that
`DLR_STATE_STORE` names (`memory`, `dir:PATH`, `redis://...`) with `check=False`, so the
server starts while Redis is down and runs *degraded* until it answers. It holds:

- `store`: the `StateStore` (also `AppContext.state_store`), with the quotas
  `state_max_sessions`, `state_max_bytes`, `state_ttl_s`;
- `writer`: the `CheckpointWriter` (write-behind, batched, retried with backoff);
- `parked`: the `ParkedCache` (RAM tier, `parked_ram_bytes`; 0 with the memory store, which
  is RAM already);
- `signer`: the `StateSigner` (`DLR_STATE_SECRET`): every blob that leaves the process or
  reaches the store is sealed (`seal`) and every blob that comes back is opened (`unseal`)
  before the engine sees it.

`checkpoints` is True when the store outlives the process (dir or redis): only then are
sessions written through at their safe points (text: start and every finished turn; speech:
start, every `checkpoint_audio_s` of audio, the final). With the memory store nothing
survives a crash; it still holds parked sessions.

Readiness contract (`readiness()`): the store being down never makes the server unready (live
sessions and requests that need no store keep working; `/readyz` stays 200 with
`"degraded": true` and the reason); only draining or start-up does.
"""

from __future__ import annotations

import logging
import os
import time

from dlr_runtime.engine import SNAPSHOT_VERSION

from .metrics import Metrics
from .registry import ModelEntry
from .settings import Settings
from .store import (
    CheckpointWriter,
    Evicted,
    ParkedCache,
    Restored,
    StateSigner,
    StateStore,
    StoreError,
    StoreLimits,
    Verified,
    WriterConfig,
    open_store,
    parse_store_url,
)

log = logging.getLogger("dlr.durable")


def limits_of(settings: Settings) -> StoreLimits:
    return StoreLimits(
        max_entries=settings.state_max_sessions or None,
        max_bytes=settings.state_max_bytes or None,
        ttl_s=settings.state_ttl_s or None,
    )


def signer_of(settings: Settings) -> StateSigner:
    env = {
        "DLR_STATE_SECRET": settings.state_secret,
        "DLR_STATE_SECRET_PREVIOUS": os.environ.get("DLR_STATE_SECRET_PREVIOUS", ""),
    }
    return StateSigner.from_env(env)


class Durable:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        store: StateStore,
        signer: StateSigner,
        kind: str,
    ) -> None:
        self.settings, self.metrics, self.store, self.signer = settings, metrics, store, signer
        self.kind = kind  # "memory" | "dir" | "redis"
        self.checkpoints = kind != "memory"
        self.evicted: list[Evicted] = []  # evictions not yet told to a client (drained by app)
        self.on_evict = None  # set by the app: Callable[[Evicted], None]
        self.on_written = None  # set by the app: Callable[[str, object], None] (sid, tag)
        self._parked_ids: set[str] = set()  # parked sessions whose store copy is theirs
        self.writer = CheckpointWriter(
            store, WriterConfig(), on_evict=self._evicted, on_written=self._written
        )
        ram = settings.parked_ram_bytes if self.checkpoints else 0
        self.parked = ParkedCache(store, max_bytes=ram, writer=self.writer)

    @classmethod
    async def open(cls, settings: Settings, metrics: Metrics) -> Durable:
        kind, _ = parse_store_url(settings.state_store)  # (ValueError: a bad URL stops start-up)
        store = await open_store(settings.state_store, limits_of(settings), check=False)
        d = cls(settings, metrics, store, signer_of(settings), kind)
        d.writer.start()
        log.info("state store: %s (checkpoints %s)", kind, "on" if d.checkpoints else "off")
        return d

    async def close(self, timeout: float = 5.0) -> None:
        await self.writer.close(timeout)
        await self.store.close()

    # ---- signed state
    def ttl(self) -> float | None:
        return self.settings.state_ttl_s or None

    def seal(self, m: ModelEntry, snapshot: bytes, sid: str | None = None) -> bytes:
        """The signed envelope of an engine snapshot of model `m`."""
        return self.signer.sign(
            snapshot, m.name, m.engine.config_hash, SNAPSHOT_VERSION, self.ttl(), sid
        )

    def unseal(self, blob: bytes, m: ModelEntry, sid: str | None = None) -> Verified:
        """Verify an envelope for model `m` (EnvelopeError with `.reason`/`.status`)."""
        return self.signer.verify(
            blob, m.engine.config_hash, SNAPSHOT_VERSION, self.settings.max_state_bytes, sid
        )

    # ---- checkpoints and the parked tier
    def checkpoint(self, sid: str, blob: bytes, tag: object = None) -> bool:
        """Queue a sealed checkpoint (returns at once, never raises)."""
        ok = self.writer.submit(sid, blob, self.ttl(), tag=tag)
        self.metrics.checkpoints.labels("submitted" if ok else "refused").inc()
        return ok

    def forget(self, sid: str) -> None:
        """The session ended for good: drop every copy of it."""
        self.parked.discard(sid)
        if self.checkpoints or sid in self._parked_ids:
            self.writer.submit_delete(sid)
        self._parked_ids.discard(sid)

    async def park(self, sid: str, blob: bytes) -> None:
        """Keep a parked session's sealed snapshot (RAM, and the store behind it)."""
        t0 = time.perf_counter()
        self._parked_ids.add(sid)
        await self.parked.park(sid, blob, self.ttl())
        self.metrics.park_seconds.labels("park").observe(time.perf_counter() - t0)

    async def load(self, sid: str) -> Restored | None:
        """The newest stored or parked blob of `sid` (None: none, or the store is down)."""
        t0 = time.perf_counter()
        try:
            r = await self.parked.restore(sid)
        except StoreError as e:
            log.warning("state of %s not readable: %s", sid, e)
            self.metrics.store_failures.labels("read").inc()
            return None
        if r is not None:
            self.metrics.park_seconds.labels("restore").observe(time.perf_counter() - t0)
        return r

    def _written(self, sid: str, tag: object) -> None:
        self.metrics.checkpoints.labels("written").inc()
        if self.on_written is not None:
            self.on_written(sid, tag)

    def _evicted(self, ev: Evicted) -> None:
        self.metrics.store_evictions.labels(str(ev.reason)).inc()
        if self.on_evict is not None:
            self.on_evict(ev)

    # ---- readiness and metrics
    def readiness(self) -> dict:
        w = self.writer
        return {
            "state_store": self.kind,
            "degraded": w.degraded,
            **({"degraded_reason": w.reason} if w.degraded else {}),
            "checkpoint_backlog": w.backlog,
        }

    async def update_metrics(self) -> None:
        m, w = self.metrics, self.writer.stats()
        m.checkpoint_backlog.set(w.backlog)
        m.store_degraded.set(1 if w.degraded else 0)
        p = self.parked.stats()
        m.parked_ram_bytes.set(p.bytes)
        try:
            s = await self.store.stats()
        except StoreError:
            return
        m.store_entries.set(s.entries)
        m.store_bytes.set(s.bytes)
        m.store_write_p99.set(s.write_latency.p99)
        m.store_read_p99.set(s.read_latency.p99)
        m.store_failures_total.set(s.failures + w.failures)
