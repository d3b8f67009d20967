"""Logprobs of a prompt's own tokens (for `echo` with `logprobs` on /v1/completions).

`Engine.prefill` returns only the logits after each prompt's last token. Echoed logprobs need
the logits after every position, so `prefill_all_logits(engine, slot, tokens)` feeds a fresh
slot the same pieces `Engine.prefill` would (full blocks, then the binary decomposition of the
rest) through the engine's backend and pool, keeping every position's logits (T, V). A prefix
cache cannot help here (cached states carry no per-position logits), so this is always a
full prefill.

`prompt_token_logprobs(all_logits, tokens, k)`: the logprob of tokens[i] under the logits after
tokens[i-1] (i >= 1) and the top k there. Prompts start with bos, so every echoed text token
has a logprob.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .engine import split_lengths
from .logit_processors import TokenLogprobs, logprobs


def prefill_all_logits(engine: Any, slot: int, tokens: Sequence[int]) -> torch.Tensor:
    """Prefill `tokens` into `slot`; the logits after every position (T, V)."""
    if not tokens:
        raise ValueError("prefill needs at least one token")
    vocab = engine.config.vocab_size
    if min(tokens) < 0 or max(tokens) >= vocab:
        raise ValueError(f"token ids must be in [0, {vocab})")
    idx = engine.pool.index([slot])
    out, pos = [], 0
    for length in split_lengths(len(tokens), engine.prefill_block):
        x = torch.tensor([list(tokens[pos : pos + length])], device=engine.device)  # (1, length)
        y, new = engine.backend.chunk(x, engine.pool.gather(idx))  # y (1, length, V)
        engine.pool.scatter(idx, new)
        out.append(y[0])
        pos += length
    return torch.cat(out)  # (T, V)


def prompt_token_logprobs(all_logits: torch.Tensor, tokens: Sequence[int], k: int) -> TokenLogprobs:
    """Logprobs of tokens[1:] given what precedes each (T - 1 rows), with the top k."""
    nxt = torch.as_tensor(list(tokens[1:]), dtype=torch.int64)  # (T-1,)
    return logprobs(all_logits[:-1], nxt, k)
