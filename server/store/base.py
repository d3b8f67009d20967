"""The `StateStore` interface: typed records, errors, limits and the stats every store keeps.

A store maps a session id (a uuid4 hex string, 32 lowercase hex digits; see `check_id`) to one
opaque blob (a signed state envelope) with a per-entry lifetime and an LRU order. Quotas
(`StoreLimits.max_entries`, `.max_bytes`) are enforced on every put by evicting the least
recently used other entries; each put reports what it evicted (`PutResult.evicted`) so the
server can tell a connected client that its stored session is gone.

Subclasses implement the `_`-prefixed coroutines; the public methods here validate ids, time
every call, count failures and turn backend errors into `StoreUnavailable`, so every store
reports the same `StoreStats` and raises the same errors.
"""

from __future__ import annotations

import abc
import re
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

_ID = re.compile(r"[0-9a-f]{32}")
_LATENCY_WINDOW = 4096  # recent calls kept per op for p50/p99


class StoreError(Exception):
    """Base of every state-store error."""


class StoreUnavailable(StoreError):
    """The backend could not be reached or failed (Redis down, disk error); worth retrying."""


class InvalidId(StoreError, ValueError):
    """A session id that is not 32 lowercase hex digits (a uuid4 hex)."""


class ValueTooLarge(StoreError, ValueError):
    """One blob is larger than the store's quota allows."""


def check_id(key: object) -> str:
    """Return `key` if it is a uuid hex (32 lowercase hex digits); raise `InvalidId` otherwise.
    Ids become file names and Redis keys, so nothing else may pass."""
    if not isinstance(key, str) or _ID.fullmatch(key) is None:
        raise InvalidId(f"session id must be 32 lowercase hex digits, got {str(key)[:80]!r}")
    return key


class EvictReason(StrEnum):
    MAX_ENTRIES = "max_entries"  # the store holds `max_entries` already
    MAX_BYTES = "max_bytes"  # the store's blobs would exceed `max_bytes`
    EXPIRED = "expired"  # its TTL passed (found while sweeping)


@dataclass(frozen=True)
class StoreLimits:
    """Quotas and lifetimes of one store."""

    max_entries: int | None = None  # most stored sessions (None: unbounded)
    max_bytes: int | None = None  # most blob bytes in all (None: unbounded)
    ttl_s: float | None = None  # default lifetime of an entry (None: no expiry)

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_bytes", "ttl_s"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"StoreLimits.{name} must be positive or None, got {v}")


@dataclass(frozen=True)
class EntryInfo:
    """What a store knows about one entry (times are wall-clock seconds since the epoch)."""

    key: str
    nbytes: int
    accessed_at: float  # last put / get / touch: the LRU order
    expires_at: float | None  # None: no expiry


@dataclass(frozen=True)
class Entry:
    info: EntryInfo
    data: bytes


@dataclass(frozen=True)
class Evicted:
    key: str
    nbytes: int
    reason: EvictReason


@dataclass(frozen=True)
class PutResult:
    info: EntryInfo
    evicted: tuple[Evicted, ...] = ()  # other entries removed to make room, or found expired


@dataclass(frozen=True)
class PutItem:
    """One write of a batch (`StateStore.put_many`)."""

    key: str
    data: bytes
    ttl_s: float | None = None  # None: the store's default


@dataclass(frozen=True)
class Latency:
    """Recent call latencies of one operation, in seconds."""

    count: int
    p50: float
    p99: float
    max: float


@dataclass(frozen=True)
class StoreStats:
    kind: str  # "memory" | "dir" | "redis"
    entries: int
    bytes: int
    writes: int
    reads: int
    hits: int
    misses: int
    failures: int  # calls that raised StoreUnavailable
    evictions: dict[str, int]  # by EvictReason value
    write_latency: Latency
    read_latency: Latency


@dataclass
class _Counters:
    writes: int = 0
    reads: int = 0
    hits: int = 0
    misses: int = 0
    failures: int = 0
    evictions: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in EvictReason})
    write_s: deque[float] = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW))
    read_s: deque[float] = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW))


def latency(samples: Iterable[float]) -> Latency:
    xs = sorted(samples)
    if not xs:
        return Latency(0, 0.0, 0.0, 0.0)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return Latency(len(xs), pick(0.50), pick(0.99), xs[-1])


class StateStore(abc.ABC):
    """Async key -> blob store with TTL, quotas and LRU eviction (see the module docstring)."""

    kind = ""
    backend_errors: tuple[type[BaseException], ...] = (OSError, TimeoutError)

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self.limits = limits or StoreLimits()
        self._c = _Counters()

    # ---- public API
    async def put(self, key: str, data: bytes, ttl_s: float | None = None) -> PutResult:
        """Store `data` under `key` (replacing it), then evict to fit the quotas."""
        return (await self.put_many([PutItem(key, data, ttl_s)]))[0]

    async def put_many(self, items: list[PutItem]) -> list[PutResult]:
        """Store a batch (one round trip where the backend allows); results in item order.
        Subclasses get the items with `ttl_s` resolved (None: no expiry)."""
        for it in items:
            check_id(it.key)
            self.check_blob(it.data)
        items = [PutItem(it.key, bytes(it.data), self._ttl(it.ttl_s)) for it in items]
        t0 = time.perf_counter()
        out = await self._call(self._put_many(items))
        dt = time.perf_counter() - t0
        self._c.writes += len(items)
        self._c.write_s.extend([dt / max(1, len(items))] * len(items))
        for r in out:
            for ev in r.evicted:
                self._c.evictions[ev.reason.value] += 1
        return out

    async def get(self, key: str) -> Entry | None:
        """The entry (and mark it used), or None when absent or expired."""
        check_id(key)
        t0 = time.perf_counter()
        out = await self._call(self._get(key))
        self._c.read_s.append(time.perf_counter() - t0)
        self._c.reads += 1
        if out is None:
            self._c.misses += 1
        else:
            self._c.hits += 1
        return out

    async def delete(self, key: str) -> bool:
        """Remove an entry; True if it was there."""
        return await self._call(self._delete(check_id(key)))

    async def touch(self, key: str, ttl_s: float | None = None) -> bool:
        """Mark an entry used and restart its lifetime (`ttl_s`, default the store's)."""
        return await self._call(self._touch(check_id(key), self._ttl(ttl_s)))

    async def list(self, limit: int | None = None) -> list[EntryInfo]:
        """Live entries, least recently used first (at most `limit`)."""
        return await self._call(self._list(limit))

    async def count(self) -> int:
        return await self._call(self._count())

    async def usage(self) -> tuple[int, int]:
        """(entries, bytes) of the live entries."""
        return await self._call(self._usage())

    async def stats(self) -> StoreStats:
        """Counters and latencies of this process's calls, plus the store's size (entries and
        bytes are -1 when the backend cannot be reached)."""
        try:
            n, b = await self.usage()
        except StoreUnavailable:
            n, b = -1, -1
        c = self._c
        return StoreStats(
            kind=self.kind,
            entries=n,
            bytes=b,
            writes=c.writes,
            reads=c.reads,
            hits=c.hits,
            misses=c.misses,
            failures=c.failures,
            evictions=dict(c.evictions),
            write_latency=latency(c.write_s),
            read_latency=latency(c.read_s),
        )

    async def close(self) -> None:  # noqa: B027  (most stores hold nothing to release)
        """Release connections and files."""

    # ---- helpers for subclasses
    def _ttl(self, ttl_s: float | None) -> float | None:
        ttl = self.limits.ttl_s if ttl_s is None else ttl_s
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl}")
        return ttl

    def check_blob(self, data: bytes) -> None:
        """Raise TypeError / ValueTooLarge for a blob this store can never take."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"a stored state must be bytes, got {type(data).__name__}")
        cap = self.limits.max_bytes
        if cap is not None and len(data) > cap:
            raise ValueTooLarge(f"state of {len(data)} bytes exceeds the store's max_bytes={cap}")

    async def _call(self, coro):
        try:
            return await coro
        except StoreError as e:
            if isinstance(e, StoreUnavailable):
                self._c.failures += 1
            raise
        except self.backend_errors as e:
            self._c.failures += 1
            raise StoreUnavailable(f"{self.kind} store: {type(e).__name__}: {e}") from e

    # ---- implemented by the stores
    @abc.abstractmethod
    async def _put_many(self, items: list[PutItem]) -> list[PutResult]: ...

    @abc.abstractmethod
    async def _get(self, key: str) -> Entry | None: ...

    @abc.abstractmethod
    async def _delete(self, key: str) -> bool: ...

    @abc.abstractmethod
    async def _touch(self, key: str, ttl_s: float | None) -> bool: ...

    @abc.abstractmethod
    async def _list(self, limit: int | None) -> list[EntryInfo]: ...

    async def _count(self) -> int:
        return (await self._usage())[0]

    @abc.abstractmethod
    async def _usage(self) -> tuple[int, int]: ...
