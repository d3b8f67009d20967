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

With `cache=None` (or a zero-byte cache) it is exactly `engine.prefill`. `pin_prefix` prefills a
prefix in a scratch slot and pins it (for `POST /v1/prefixes`). `prefill_n` prefills once and
forks the slot into n (for `n > 1`: one prefill, n - 1 state copies).
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


def _points(n: int, hit: int, bounds: Sequence[int]) -> list[int]:
    """Insert points after the hit: the given boundaries inside (hit, n], and n."""
    return sorted({b for b in bounds if hit < b < n} | {n})


def prefill_cached(
    engine: Any,
    cache: PrefixCache | None,
    slots: Sequence[int],
    token_lists: Sequence[Sequence[int]],
    boundaries: Sequence[Sequence[int]] | None = None,
) -> CachedPrefill:
    """Prefill fresh slots through `cache`; see the module docstring."""
    if len(slots) != len(token_lists):
        raise ValueError("prefill_cached needs one token list per slot")
    if boundaries is not None and len(boundaries) != len(slots):
        raise ValueError("prefill_cached needs one boundary list per slot")
    if any(len(t) == 0 for t in token_lists):
        raise ValueError("prefill needs at least one token per slot")
    if cache is None or cache.max_bytes == 0:
        logits = engine.prefill(slots, token_lists)
        return CachedPrefill(logits, [0] * len(slots), [len(t) for t in token_lists])

    tokens = [tuple(t) for t in token_lists]
    vocab = engine.config.vocab_size
    for t in tokens:  # check before touching any slot, as engine.prefill does
        if min(t) < 0 or max(t) >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab})")
    last: list[torch.Tensor | None] = [None] * len(slots)
    pos, plans = [0] * len(slots), []
    for i, (slot, t) in enumerate(zip(slots, tokens, strict=True)):
        hit = cache.lookup(t)
        if hit.length == len(t) and hit.logits is None:  # needs one token run for its logits
            hit = cache.lookup(t, max_len=len(t) - 1)
        if hit.length:
            import_state(engine, slot, hit.state)  # type: ignore[arg-type]
            pos[i] = hit.length
            last[i] = hit.logits if hit.length == len(t) else None
        bounds = [*(boundaries[i] if boundaries else ()), cache.shared_length(t)]
        plans.append(_points(len(t), hit.length, bounds))
    cached = list(pos)
    while True:
        rows = [i for i in range(len(slots)) if pos[i] < len(tokens[i])]
        if not rows:
            break
        ends = [next(p for p in plans[i] if p > pos[i]) for i in rows]
        out = engine.prefill(
            [slots[i] for i in rows],
            [tokens[i][pos[i] : e] for i, e in zip(rows, ends, strict=True)],
        )  # (b, V)
        for j, (i, e) in enumerate(zip(rows, ends, strict=True)):
            pos[i], last[i] = e, out[j]
            cache.insert(tokens[i][:e], export_state(engine, slots[i]), out[j])
    logits = torch.stack([x.to(engine.device) for x in last])  # type: ignore[union-attr]
    return CachedPrefill(logits, cached, [len(t) - c for t, c in zip(tokens, cached, strict=True)])


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
