"""An in-process LRU index with per-entry expiry and byte accounting.

Used by the memory and directory stores (and the parked-snapshot tier) for their bookkeeping:
which entries exist, how large they are, when each was last used and when it expires. It holds
no blobs. Expired entries are invisible at once (`get` returns None) and removed by `sweep`,
which keeps them in `expired` until the next put reports them.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator

from .base import EntryInfo, Evicted, EvictReason


class LruIndex:
    def __init__(self) -> None:
        self._od: OrderedDict[str, EntryInfo] = OrderedDict()  # least recently used first
        self._heap: list[tuple[float, str]] = []  # (expires_at, key); stale items are skipped
        self.bytes = 0
        self.expired: list[Evicted] = []  # swept, not yet reported by a put

    def __len__(self) -> int:
        return len(self._od)

    def __contains__(self, key: str) -> bool:
        return key in self._od

    def items(self, now: float) -> Iterator[EntryInfo]:
        """Live entries, least recently used first."""
        return (i for i in self._od.values() if not is_expired(i, now))

    def oldest(self) -> EntryInfo:
        """The least recently used entry (expired or not); the index must not be empty."""
        return next(iter(self._od.values()))

    def get(self, key: str, now: float) -> EntryInfo | None:
        info = self._od.get(key)
        return None if info is None or is_expired(info, now) else info

    def set(self, key: str, nbytes: int, ttl_s: float | None, now: float) -> EntryInfo:
        self.pop(key)
        return self._insert(EntryInfo(key, nbytes, now, None if ttl_s is None else now + ttl_s))

    def restore(self, info: EntryInfo) -> None:
        """Insert a known entry (rebuilding an index from disk: call in LRU order)."""
        self.pop(info.key)
        self._insert(info)

    def use(self, key: str, now: float, ttl_s: float | None = None, renew: bool = False) -> bool:
        """Mark used (move to the MRU end); with `renew`, the lifetime restarts at `ttl_s`."""
        info = self.get(key, now)
        if info is None:
            return False
        expires = (None if ttl_s is None else now + ttl_s) if renew else info.expires_at
        self.pop(key)
        self._insert(EntryInfo(key, info.nbytes, now, expires))
        return True

    def pop(self, key: str) -> EntryInfo | None:
        info = self._od.pop(key, None)
        if info is not None:
            self.bytes -= info.nbytes
        return info

    def sweep(self, now: float) -> None:
        """Remove the expired entries (kept in `expired`)."""
        h = self._heap
        while h and h[0][0] <= now:
            exp, key = heapq.heappop(h)
            info = self._od.get(key)
            if info is not None and info.expires_at == exp:
                self.pop(key)
                self.expired.append(Evicted(key, info.nbytes, EvictReason.EXPIRED))
        if len(h) > 2 * len(self._od) + 64:  # drop stale heap items now and then
            self._heap = [(i.expires_at, i.key) for i in self._od.values() if i.expires_at]
            heapq.heapify(self._heap)

    def fit(
        self, max_entries: int | None, max_bytes: int | None, keep: set[str] | frozenset = ()
    ) -> list[Evicted]:
        """Pop least recently used entries (never those in `keep`) until within the quotas."""
        out: list[Evicted] = []
        while True:  # O(evicted + len(keep)) per call, whatever the number of entries
            n_over = max_entries is not None and len(self._od) > max_entries
            b_over = max_bytes is not None and self.bytes > max_bytes
            if not (n_over or b_over):
                break
            key = next((k for k in self._od if k not in keep), None)
            if key is None:
                break
            info = self.pop(key)
            reason = EvictReason.MAX_ENTRIES if n_over else EvictReason.MAX_BYTES
            out.append(Evicted(key, info.nbytes, reason))
        return out

    def take_expired(self) -> list[Evicted]:
        out, self.expired = self.expired, []
        return out

    def _insert(self, info: EntryInfo) -> EntryInfo:
        self._od[info.key] = info
        self.bytes += info.nbytes
        if info.expires_at is not None:
            heapq.heappush(self._heap, (info.expires_at, info.key))
        return info


def is_expired(info: EntryInfo, now: float) -> bool:
    return info.expires_at is not None and info.expires_at <= now
