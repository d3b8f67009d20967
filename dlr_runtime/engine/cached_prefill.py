"""Prefill through the prefix-state cache: load the longest cached prefix, prefill only the rest.

`prefill_cached(engine, cache, slots, token_lists, boundaries=None)` is the batched drop-in for
`engine.prefill(slots, token_lists)` on freshly opened slots (zero state; each token list is the
whole sequence from the start, bos included). Per row it

1. looks up the longest cached prefix of its tokens and loads that state into the slot,
2. prefills the rest in segments that end at each insert point: every boundary given for the
   row (e.g. the end of every chat message) beyond the hit, the point where the prompt branches
   off the keys already on the cache's tree (so prompts sharing a prefix hit from the second
   sibling on, at any token), and the end of the prompt,
3. inserts the state (and logits) at each insert point into the cache,

and returns the logits after each row's last token (B, V), equal to a cold `engine.prefill`
up to float32 rounding: a cached state was computed with another piece segmentation than a cold
prefill would use (tests check 1e-4 on logits, and identical greedy and seeded tokens).

With `cache=None` (or a zero-byte cache) it is exactly `engine.prefill`.

- `plan_prefill(engine, cache, slot, tokens, boundaries) -> PrefixPlan`: steps 1 and the plan
  of 2-3, for a scheduler that prefills in pieces of its own token budget;
- `pin_prefix` prefills a prefix in a scratch slot and pins it (for `POST /v1/prefixes`);
- `prefill_n` prefills once and forks the slot into n (for `n > 1`: one prefill, n - 1 state
  copies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .prefix_cache import PrefixCache
from .slot_state import Fork, export_state, fork, import_state


@dataclass
class CachedPrefill:
    """Logits after each row's prompt, and per row how much of it the cache covered."""

    logits: torch.Tensor  # (B, V)
    cached_tokens: list[int]  # per row: tokens loaded from the cache (not prefilled)
    prefilled_tokens: list[int]  # per row: tokens run through the model


@dataclass
class PrefixPlan:
    """One slot's prefill through the cache: what was loaded, and where to store states.

    For a scheduler that prefills in pieces of its own (a token budget per step): after
    `plan_prefill`, feed `tokens[cached:]` in pieces that never cross an insert point
    (`next_end(pos, budget)`), and call `reached(engine, slot, end, logits)` after each piece.
    """

    tokens: tuple[int, ...]  # the whole sequence from the start (bos included)
    cached: int  # tokens loaded from the cache into the slot (0 = a miss)
    points: list[int]  # insert points > cached, ascending; the last is len(tokens)
    logits: torch.Tensor | None  # (V,) logits after the last token when all of it was cached
    cache: PrefixCache | None = None

    def next_end(self, pos: int, budget: int | None = None) -> int:
        """End of the next piece starting at `pos`: at most `budget` tokens, and never past
        the next insert point."""
        stop = next((p for p in self.points if p > pos), len(self.tokens))
        return stop if budget is None else min(stop, pos + budget)

    def reached(self, engine: Any, slot: int, end: int, logits: torch.Tensor) -> None:
        """Called after prefilling up to `end` with the logits there (V,): stores the state
        when `end` is an insert point; keeps the logits when it is the end of the prompt."""
        if end == len(self.tokens):
            self.logits = logits
        if self.cache is not None and end in self.points:
            self.cache.insert(self.tokens[:end], export_state(engine, slot), logits)


def plan_prefill(
    engine: Any,
    cache: PrefixCache | None,
    slot: int,
    tokens: Sequence[int],
    boundaries: Sequence[int] = (),
) -> PrefixPlan:
    """Load the longest cached prefix of `tokens` into a fresh `slot`; plan the insert points
    (the boundaries beyond the hit, where the prompt branches off the cache's keys, the end)."""
    t = tuple(tokens)
    if not t:
        raise ValueError("prefill needs at least one token per slot")
    vocab = engine.config.vocab_size
    if min(t) < 0 or max(t) >= vocab:  # checked before touching the slot, as engine.prefill
        raise ValueError(f"token ids must be in [0, {vocab})")
    if cache is None or cache.max_bytes == 0:
        return PrefixPlan(t, 0, [len(t)], None, None)
    hit = cache.lookup(t)
    if hit.length == len(t) and hit.logits is None:  # needs one token run for its logits
        hit = cache.lookup(t, max_len=len(t) - 1)
    if hit.length:
        import_state(engine, slot, hit.state)  # type: ignore[arg-type]
    bounds = {b for b in (*boundaries, cache.shared_length(t)) if hit.length < b < len(t)}
    points = sorted(bounds | {len(t)}) if hit.length < len(t) else []
    logits = hit.logits if hit.length == len(t) else None
    return PrefixPlan(t, hit.length, points, logits, cache)


def prefill_cached(
    engine: Any,
    cache: PrefixCache | None,
    slots: Sequence[int],
    token_lists: Sequence[Sequence[int]],
    boundaries: Sequence[Sequence[int]] | None = None,
) -> CachedPrefill:
    """Prefill fresh slots through `cache`, batched; see the module docstring."""
    if len(slots) != len(token_lists):
        raise ValueError("prefill_cached needs one token list per slot")
    if boundaries is not None and len(boundaries) != len(slots):
        raise ValueError("prefill_cached needs one boundary list per slot")
    if any(len(t) == 0 for t in token_lists):
        raise ValueError("prefill needs at least one token per slot")
    if cache is None or cache.max_bytes == 0:
        logits = engine.prefill(slots, token_lists)
        return CachedPrefill(logits, [0] * len(slots), [len(t) for t in token_lists])
    plans = [
        plan_prefill(engine, cache, s, t, boundaries[i] if boundaries else ())
        for i, (s, t) in enumerate(zip(slots, token_lists, strict=True))
    ]
    pos = [p.cached for p in plans]
    while True:
        rows = [i for i, p in enumerate(plans) if pos[i] < len(p.tokens)]
        if not rows:
            break
        ends = [plans[i].next_end(pos[i]) for i in rows]
        out = engine.prefill(
            [slots[i] for i in rows],
            [plans[i].tokens[pos[i] : e] for i, e in zip(rows, ends, strict=True)],
        )  # (b, V)
        for j, (i, e) in enumerate(zip(rows, ends, strict=True)):
            pos[i] = e
            plans[i].reached(engine, slots[i], e, out[j])
    logits = torch.stack([p.logits.to(engine.device) for p in plans])  # type: ignore[union-attr]
    cached = [p.cached for p in plans]
    return CachedPrefill(logits, cached, [len(p.tokens) - p.cached for p in plans])


def pin_prefix(engine: Any, cache: PrefixCache, tokens: Sequence[int]) -> CachedPrefill:
    """Prefill `tokens` in a scratch slot (through the cache) and pin the result.

    Raises PoolFullError when no slot is free and PrefixCacheFull when it cannot be pinned.
    """
    slot = engine.open()
    try:
        res = prefill_cached(engine, cache, [slot], [tokens])
        cache.insert(tokens, export_state(engine, slot), res.logits[0], pin=True)
        return res
    finally:
        engine.close(slot)


@dataclass
class ForkedPrefill:
    """One prefill shared by n choices: the slots (the first is the prefilled one)."""

    slots: list[int]  # n slots holding the same state after the prompt
    logits: torch.Tensor  # (V,) after the prompt, the same for every slot
    cached_tokens: int  # prompt tokens loaded from the cache
    fork: Fork  # cost of making the n - 1 copies


def prefill_n(
    engine: Any,
    cache: PrefixCache | None,
    tokens: Sequence[int],
    n: int,
    boundaries: Sequence[int] = (),
) -> ForkedPrefill:
    """Open a slot, prefill `tokens` through the cache once, and fork it into n slots in all
    (for `n > 1` on completions). Frees every slot it took if anything fails."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    slot = engine.open()
    try:
        res = prefill_cached(engine, cache, [slot], [tokens], [boundaries])
        copies = fork(engine, slot, n - 1)
    except BaseException:
        engine.close(slot)
        raise
    return ForkedPrefill([slot, *copies.slots], res.logits[0], res.cached_tokens[0], copies)
