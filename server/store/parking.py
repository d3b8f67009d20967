"""`ParkedCache`: the parked tier between live pool slots and the store.

A session that is idle, or pushed out of a full pool, is *parked*: its snapshot (a signed
envelope) goes here and its slot is freed. The cache keeps parked snapshots in RAM, bounded by
`max_bytes`, least recently parked first out. With a `CheckpointWriter` every park is also
submitted to the store (write-behind), so a snapshot pushed out of RAM is simply dropped from
RAM: the store (or the writer's backlog) holds it. Without a writer, a snapshot pushed out of
RAM is written to the store before `park` returns.

`restore(key)` looks in RAM, then in the writer's backlog, then in the store, and removes the
RAM copy (the session becomes live again; its store copy stays as its checkpoint). Sessions
per server are therefore bounded by the store, not by pool slots or this cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

from .base import EntryInfo, Evicted, Latency, StateStore, check_id, latency
from .lru import LruIndex
from .writer import CheckpointWriter

_WINDOW = 4096


class Tier(StrEnum):
    RAM = "ram"
    BACKLOG = "backlog"  # written by the writer soon, not yet confirmed by the store
    STORE = "store"


@dataclass(frozen=True)
class Restored:
    data: bytes
    tier: Tier


@dataclass(frozen=True)
class ParkResult:
    spilled: tuple[str, ...] = ()  # sessions pushed out of RAM (now only in the store)
    evicted: tuple[Evicted, ...] = ()  # store evictions caused by writing them (no writer)


@dataclass(frozen=True)
class ParkedStats:
    entries: int  # snapshots in RAM
    bytes: int
    max_bytes: int
    parked: int
    spilled: int
    restored: dict[str, int]  # by Tier value
    misses: int
    restore_latency: Latency


class ParkedCache:
    def __init__(
        self, store: StateStore, max_bytes: int, writer: CheckpointWriter | None = None
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.store, self.max_bytes, self.writer = store, max_bytes, writer
        self._ix = LruIndex()
        self._data: dict[str, bytes] = {}
        self._n = {"parked": 0, "spilled": 0, "misses": 0}
        self._restored = {t.value: 0 for t in Tier}
        self._lat: list[float] = []

    def __contains__(self, key: str) -> bool:
        return key in self._data

    async def park(self, key: str, data: bytes, ttl_s: float | None = None) -> ParkResult:
        """Keep a parked snapshot (see the module docstring). Without a writer, a store
        failure while spilling raises `StoreUnavailable` (the snapshot stays in RAM)."""
        check_id(key)
        data = bytes(data)
        if self.writer is not None:
            self.writer.submit(key, data, ttl_s)
        now = time.time()
        self._ix.sweep(now)
        for ev in self._ix.take_expired():
            del self._data[ev.key]
        self._ix.set(key, len(data), ttl_s, now)
        self._data[key] = data
        self._n["parked"] += 1
        spilled: list[str] = []
        evicted: list[Evicted] = []
        while self._ix.bytes > self.max_bytes and len(self._ix):
            victim = self._ix.oldest()
            if self.writer is None:
                r = await self.store.put(victim.key, self._data[victim.key], _ttl_left(victim))
                evicted.extend(r.evicted)
            self._ix.pop(victim.key)
            del self._data[victim.key]
            spilled.append(victim.key)
        self._n["spilled"] += len(spilled)
        return ParkResult(tuple(spilled), tuple(evicted))

    async def restore(self, key: str) -> Restored | None:
        """The parked snapshot from the nearest tier, or None if no tier has it (expired,
        evicted or never parked). The RAM copy is removed."""
        check_id(key)
        t0 = time.perf_counter()
        out = self._take(key)
        if out is None and self.writer is not None and (p := self.writer.peek(key)) is not None:
            if p.data is None:  # its delete is pending: the session ended
                return self._miss()
            out = Restored(p.data, Tier.BACKLOG)
        if out is None:
            e = await self.store.get(key)
            if e is None:
                return self._miss()
            out = Restored(e.data, Tier.STORE)
        self._restored[out.tier.value] += 1
        self._lat.append(time.perf_counter() - t0)
        del self._lat[:-_WINDOW]
        return out

    def discard(self, key: str) -> None:
        """Forget the RAM copy (the session ended; delete its store copy separately)."""
        if self._ix.pop(key) is not None:
            del self._data[key]

    def stats(self) -> ParkedStats:
        return ParkedStats(
            entries=len(self._ix),
            bytes=self._ix.bytes,
            max_bytes=self.max_bytes,
            parked=self._n["parked"],
            spilled=self._n["spilled"],
            restored=dict(self._restored),
            misses=self._n["misses"],
            restore_latency=latency(self._lat),
        )

    def _take(self, key: str) -> Restored | None:
        info = self._ix.pop(key)
        if info is None:
            return None
        data = self._data.pop(key)
        if info.expires_at is not None and info.expires_at <= time.time():
            return None
        return Restored(data, Tier.RAM)

    def _miss(self) -> None:
        self._n["misses"] += 1
        return None


def _ttl_left(info: EntryInfo) -> float | None:
    """The lifetime left of a RAM entry (for its store copy)."""
    if info.expires_at is None:
        return None
    return max(0.001, info.expires_at - time.time())
