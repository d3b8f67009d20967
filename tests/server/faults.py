"""Fault injection by wrapping: `FaultyEngine(inner)` stands in for a scheduler's engine.

Production code has no test hooks; a test installs the wrapper (`install(scheduler)`) and then
- `fail_next = exc`: the next batched engine call raises `exc` (the whole batch fails);
- `pause()` / `resume()`: batched engine calls block on the engine thread until resumed, so
  work queues up in the scheduler;
- `poison = {slot, ...}`: the rows of those slots come back as NaN (a session whose state was
  driven out of range), to check that failures stay in their own row.
Every other attribute is the inner engine's.
"""

from __future__ import annotations

import threading

import torch

BATCHED = ("prefill", "decode", "feed_audio", "scores")


class FaultyEngine:
    def __init__(self, inner) -> None:
        self._inner = inner
        self.fail_next: BaseException | None = None
        self.poison: set[int] = set()
        self._gate = threading.Event()
        self._gate.set()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def pause(self) -> None:
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def _enter(self) -> None:
        if not self._gate.wait(timeout=60):
            raise RuntimeError("FaultyEngine: paused for more than 60 s")
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err

    def _poisoned(self, slots, out: torch.Tensor) -> torch.Tensor:
        if not self.poison.intersection(slots):
            return out
        out = out.clone()
        for i, slot in enumerate(slots):
            if slot in self.poison:
                out[i] = float("nan")
        return out

    def prefill(self, slots, tokens):
        self._enter()
        return self._poisoned(slots, self._inner.prefill(slots, tokens))

    def decode(self, slots, tokens):
        self._enter()
        return self._poisoned(slots, self._inner.decode(slots, tokens))

    def scores(self, slots):
        self._enter()
        return self._poisoned(slots, self._inner.scores(slots))

    def feed_audio(self, slots, xs):
        self._enter()
        ys = self._inner.feed_audio(slots, xs)
        return [
            torch.full_like(y, float("nan")) if s in self.poison else y
            for s, y in zip(slots, ys, strict=True)
        ]


def install(scheduler) -> FaultyEngine:
    """Wrap `scheduler`'s engine (once) and return the wrapper."""
    if not isinstance(scheduler.engine, FaultyEngine):
        scheduler.engine = FaultyEngine(scheduler.engine)
    return scheduler.engine
