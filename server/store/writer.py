"""`CheckpointWriter`: write-behind of session checkpoints to a `StateStore`.

The engine's side calls `submit(key, blob)` (or `submit_delete(key)`) at a safe point; it
returns at once and never raises. One background task takes the pending writes in batches
(up to `batch_max`, after waiting `batch_wait_s` for more to arrive) and writes each batch
with one `put_many`. Repeated writes of the same session coalesce: only the latest pending
blob is written, also while a batch is being retried (each retry picks up newer blobs of its
sessions). A failing store (`StoreUnavailable`, or a call slower than `op_timeout_s`) is
retried with exponential backoff and jitter (tenacity) for as long as it takes; meanwhile
`degraded` is True and `reason` says why (for /readyz), failures are counted, and the backlog
keeps only the latest blob per session (bounded by `max_backlog_bytes`: beyond it the oldest
pending writes are dropped and counted). When the store answers again the flag clears and the
backlog drains. Evictions the store reports go to `on_evict` (to notify the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import AsyncRetrying, retry_if_exception_type, stop_never, wait_exponential_jitter

from .base import Evicted, PutItem, StateStore, StoreError, StoreUnavailable, check_id

log = logging.getLogger("dlr.store")


@dataclass(frozen=True)
class WriterConfig:
    batch_max: int = 64  # most writes per store call
    batch_wait_s: float = 0.002  # after the first pending write, wait this long for more
    retry_initial_s: float = 0.05  # first backoff after a failed call
    retry_max_s: float = 2.0  # longest backoff
    op_timeout_s: float = 5.0  # a store call slower than this counts as failed
    max_backlog_bytes: int = 256 << 20  # pending blob bytes kept while the store is down

    def __post_init__(self) -> None:
        if self.batch_max < 1:
            raise ValueError(f"WriterConfig.batch_max must be >= 1, got {self.batch_max}")
        for name in ("batch_wait_s", "retry_initial_s", "retry_max_s", "op_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"WriterConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_backlog_bytes < 0:
            raise ValueError("WriterConfig.max_backlog_bytes must be >= 0")


@dataclass(frozen=True)
class PendingWrite:
    """A write not yet in the store; `data` None is a pending delete."""

    key: str
    data: bytes | None
    ttl_s: float | None = None
    tag: object = None  # the caller's mark, given back to `on_written` once stored


@dataclass(frozen=True)
class WriterStats:
    submitted: int  # accepted submits
    coalesced: int  # submits that replaced a pending write of the same session
    written: int  # blobs written
    deleted: int  # deletes done
    failures: int  # failed store calls (each retry counts)
    dropped: int  # pending writes dropped (backlog over max_backlog_bytes)
    rejected: int  # submits refused (bad id, blob larger than the store allows)
    batches: int  # successful store calls
    backlog: int  # writes pending now
    backlog_bytes: int
    degraded: bool
    reason: str | None


class _Retry(Exception):
    """A store call failed in a way worth retrying."""


class CheckpointWriter:
    def __init__(
        self,
        store: StateStore,
        config: WriterConfig | None = None,
        on_evict: Callable[[Evicted], None] | None = None,
        on_written: Callable[[str, object], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config or WriterConfig()
        self.on_evict = on_evict
        self.on_written = on_written  # (key, tag) of each blob the store confirmed
        self._pending: dict[str, PendingWrite] = {}  # oldest first
        self._inflight: dict[str, PendingWrite] = {}
        self._bytes = 0  # blob bytes in _pending
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self._n = dict.fromkeys(
            (
                "submitted",
                "coalesced",
                "written",
                "deleted",
                "failures",
                "dropped",
                "rejected",
                "batches",
            ),
            0,
        )
        self.degraded = False
        self.reason: str | None = None
        self.degraded_since: float | None = None

    # ---- caller side (never raises)
    def start(self) -> None:
        """Start the background task (in the running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="checkpoint-writer"
            )

    def submit(self, key: str, data: bytes, ttl_s: float | None = None, tag: object = None) -> bool:
        """Queue a checkpoint; False (logged, counted) if the store can never take it.
        `tag` comes back to `on_written(key, tag)` once this blob is stored."""
        try:
            check_id(key)
            self.store.check_blob(data)
        except (StoreError, TypeError) as e:
            self._n["rejected"] += 1
            log.error("checkpoint of %s refused: %s", str(key)[:40], e)
            return False
        self._queue(PendingWrite(key, bytes(data), ttl_s, tag))
        return True

    def submit_delete(self, key: str) -> bool:
        """Queue the removal of a session's stored state (it ended)."""
        try:
            check_id(key)
        except StoreError as e:
            self._n["rejected"] += 1
            log.error("delete of %s refused: %s", str(key)[:40], e)
            return False
        self._queue(PendingWrite(key, None))
        return True

    def peek(self, key: str) -> PendingWrite | None:
        """The latest write of `key` not yet confirmed by the store (read your own writes)."""
        return self._pending.get(key) or self._inflight.get(key)

    async def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending; False if `timeout` passed first."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    async def close(self, timeout: float = 5.0) -> bool:
        """Flush for at most `timeout`, then stop; True if the backlog drained."""
        drained = await self.flush(timeout) if self._task is not None else not self._pending
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if not drained:
            log.warning("checkpoint writer closed with %d write(s) not stored", self.backlog)
        return drained

    @property
    def backlog(self) -> int:
        """Sessions with a write not yet confirmed by the store."""
        return len(self._pending.keys() | self._inflight.keys())

    def stats(self) -> WriterStats:
        return WriterStats(
            **self._n,
            backlog=self.backlog,
            backlog_bytes=self._bytes + _size(self._inflight),
            degraded=self.degraded,
            reason=self.reason,
        )

    # ---- internals
    def _queue(self, op: PendingWrite) -> None:
        old = self._pending.get(op.key)
        if old is not None:
            self._n["coalesced"] += 1
            self._bytes -= len(old.data or b"")
        self._pending[op.key] = op
        self._bytes += len(op.data or b"")
        self._n["submitted"] += 1
        while self._bytes > self.config.max_backlog_bytes:
            # the oldest pending blob goes (never a delete, never the one just queued)
            key = next((k for k, o in self._pending.items() if o.data and k != op.key), None)
            if key is None:
                break
            self._bytes -= len(self._pending.pop(key).data)
            self._n["dropped"] += 1
            if self._n["dropped"] % 1000 == 1:
                log.warning(
                    "checkpoint backlog over %d bytes: dropping the oldest writes (%d so far)",
                    self.config.max_backlog_bytes,
                    self._n["dropped"],
                )
        self._idle.clear()
        self._wake.set()

    def _take(self, keys) -> dict[str, PendingWrite]:
        out = {}
        for k in keys:
            op = self._pending.pop(k)
            self._bytes -= len(op.data or b"")
            out[k] = op
        return out

    async def _run(self) -> None:
        cfg = self.config
        while True:
            if not self._pending:
                if not self._inflight:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
            if len(self._pending) < cfg.batch_max and cfg.batch_wait_s > 0:
                await asyncio.sleep(cfg.batch_wait_s)
            keys = list(self._pending)[: cfg.batch_max]
            self._inflight = self._take(keys)
            try:
                await self._write_batch()
            except asyncio.CancelledError:
                self._requeue()
                raise
            except Exception:  # noqa: BLE001  (a bug here must not stop checkpointing)
                self._n["failures"] += 1
                log.exception("checkpoint writer: batch of %d dropped", len(self._inflight))
            self._inflight = {}

    def _requeue(self) -> None:
        """Put unconfirmed in-flight writes back (older than anything pending for a key)."""
        back = {k: v for k, v in self._inflight.items() if k not in self._pending}
        self._bytes += _size(back)
        self._pending = {**back, **self._pending}
        self._inflight = {}

    async def _write_batch(self) -> None:
        cfg = self.config
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Retry),
            wait=wait_exponential_jitter(
                multiplier=cfg.retry_initial_s, max=cfg.retry_max_s, jitter=cfg.retry_initial_s
            ),
            stop=stop_never,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                newer = [k for k in self._inflight if k in self._pending]  # latest wins
                self._inflight.update(self._take(newer))
                await self._attempt()

    async def _attempt(self) -> None:
        ops = list(self._inflight.values())
        puts = [PutItem(op.key, op.data, op.ttl_s) for op in ops if op.data is not None]
        dels = [op.key for op in ops if op.data is None]
        try:
            async with asyncio.timeout(self.config.op_timeout_s):
                results = await self.store.put_many(puts) if puts else []
                for k in dels:
                    await self.store.delete(k)
        except (StoreUnavailable, TimeoutError) as e:
            self._n["failures"] += 1
            why = "timed out" if isinstance(e, TimeoutError) else str(e)
            if not self.degraded:
                log.warning("state store failing (%s); retrying checkpoint writes", why)
                self.degraded_since = time.time()
            self.degraded, self.reason = True, f"state store unavailable: {why}"
            raise _Retry from e
        if self.degraded:
            log.info("state store is back; %d checkpoint write(s) pending", len(self._pending))
        self.degraded, self.reason, self.degraded_since = False, None, None
        self._n["batches"] += 1
        self._n["written"] += len(puts)
        self._n["deleted"] += len(dels)
        for r in results:
            for ev in r.evicted:
                self._notify(ev)
        if self.on_written is not None:
            for op in ops:
                if op.data is not None:
                    self._call(self.on_written, op.key, op.tag)

    def _call(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001  (a callback's bug must not stop checkpointing)
            log.exception("checkpoint writer callback failed for %s", args[0])

    def _notify(self, ev: Evicted) -> None:
        if self.on_evict is not None:
            self._call(self.on_evict, ev)


def _size(ops: dict[str, PendingWrite]) -> int:
    return sum(len(op.data or b"") for op in ops.values())
