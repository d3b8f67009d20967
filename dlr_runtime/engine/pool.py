"""State pool: fixed-shape recurrent state for up to `max_sessions` slots of one model.

The pool allocates every state tensor once, batch-first with `max_sessions` rows, on the
backend's device. A session owns one slot index; batched operations gather the rows of the
slots they touch, advance them, and scatter the new rows back. Freeing a slot zeroes its rows,
so nothing of one session can reach the next session that gets the same slot.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import torch

State = dict[str, torch.Tensor]


class PoolFullError(RuntimeError):
    """Every slot of the pool is in use."""


class SlotError(ValueError):
    """A slot index is out of range or not allocated."""


class StatePool:
    """Preallocated per-slot state of `backend` (an object with `init_state(batch, device)`)."""

    def __init__(self, backend: Any, max_sessions: int) -> None:
        if not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be a positive integer, got {max_sessions!r}")
        self.max_sessions = max_sessions
        self.state: State = backend.init_state(max_sessions)  # each (S, ...) on the device
        self.device = next(iter(self.state.values())).device
        self._free: list[int] = list(range(max_sessions))  # min-heap: lowest free slot first
        self._used: set[int] = set()

    # ------------------------------------------------------------------ slots
    @property
    def in_use(self) -> int:
        return len(self._used)

    @property
    def available(self) -> int:
        return self.max_sessions - len(self._used)

    def alloc(self) -> int:
        """Take the lowest free slot (its state is zero)."""
        if not self._free:
            raise PoolFullError(f"all {self.max_sessions} session slots are in use")
        slot = heapq.heappop(self._free)
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        """Zero the slot's state and return it to the pool."""
        self.check(slot)
        for t in self.state.values():
            t[slot].zero_()
        self._used.discard(slot)
        heapq.heappush(self._free, slot)

    def reset(self, slot: int) -> None:
        """Zero the slot's state, keeping it allocated."""
        self.check(slot)
        for t in self.state.values():
            t[slot].zero_()

    def check(self, slot: int) -> None:
        if slot not in self._used:
            raise SlotError(f"slot {slot!r} is not allocated")

    # ------------------------------------------------------------------ gather / scatter
    def index(self, slots: Sequence[int]) -> torch.Tensor:
        if len(set(slots)) != len(slots):
            raise SlotError(f"slots must be distinct, got {list(slots)}")
        for s in slots:
            self.check(s)
        return torch.as_tensor(list(slots), dtype=torch.int64, device=self.device)  # (B,)

    def gather(self, idx: torch.Tensor) -> State:
        """The state rows of slot indices `idx` (B,) as a new batch-first State."""
        return {k: v.index_select(0, idx) for k, v in self.state.items()}

    def scatter(self, idx: torch.Tensor, new: State) -> None:
        """Write batch-first `new` rows back into slots `idx` (B,)."""
        for k, v in self.state.items():
            v.index_copy_(0, idx, new[k].to(v.dtype))

    def row(self, slot: int) -> State:
        """One slot's state (views into the pool, without the batch axis)."""
        self.check(slot)
        return {k: v[slot] for k, v in self.state.items()}
