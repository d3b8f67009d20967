"""`MemoryStore`: the process's own RAM (the default; nothing survives the process)."""

from __future__ import annotations

import time
from collections.abc import Callable

from .base import Entry, EntryInfo, PutItem, PutResult, StateStore, StoreLimits
from .lru import LruIndex, is_expired


class MemoryStore(StateStore):
    kind = "memory"

    def __init__(
        self, limits: StoreLimits | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(limits)
        self._clock = clock
        self._ix = LruIndex()
        self._data: dict[str, bytes] = {}

    async def _put_many(self, items: list[PutItem]) -> list[PutResult]:
        out = []
        for it in items:
            now = self._clock()
            self._sweep(now)
            info = self._ix.set(it.key, len(it.data), it.ttl_s, now)
            self._data[it.key] = it.data
            evicted = self._ix.fit(self.limits.max_entries, self.limits.max_bytes, {it.key})
            for ev in evicted:
                self._data.pop(ev.key, None)
            out.append(PutResult(info, tuple(self._ix.take_expired() + evicted)))
        return out

    async def _get(self, key: str) -> Entry | None:
        now = self._clock()
        if not self._ix.use(key, now):
            return None
        return Entry(self._ix.get(key, now), self._data[key])

    async def _delete(self, key: str) -> bool:
        self._data.pop(key, None)
        info = self._ix.pop(key)
        return info is not None and not is_expired(info, self._clock())

    async def _touch(self, key: str, ttl_s: float | None) -> bool:
        return self._ix.use(key, self._clock(), ttl_s, renew=True)

    async def _list(self, limit: int | None) -> list[EntryInfo]:
        self._sweep(self._clock())
        items = list(self._ix.items(self._clock()))
        return items if limit is None else items[:limit]

    async def _usage(self) -> tuple[int, int]:
        self._sweep(self._clock())
        return len(self._ix), self._ix.bytes

    def _sweep(self, now: float) -> None:
        self._ix.sweep(now)
        for ev in self._ix.expired:
            self._data.pop(ev.key, None)
