"""One decode step's token choice for a batch of generating rows, with the OpenAI options.

Each generating choice owns a `ChoiceRow`: its `SamplingParams`, its `LogitParams`, the counts
of the tokens it generated (for the penalties) and its own `torch.Generator` (so its tokens
depend only on its own logits and seed, never on its batch). `choose_tokens(logits, rows)`
applies the penalties and logit_bias of every row in one batched op, samples each row with
`sample_token`, computes the logprobs the rows asked for (of the processed logits, before
temperature / top-k / top-p) and counts the chosen tokens. Rows without options get exactly
what `sample_token` gives on the raw logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .logit_processors import LogitParams, TokenCounts, logprobs, process
from .sampling import SamplingParams, sample_token


@dataclass
class ChoiceRow:
    """Per-choice decoding state (one per generated sequence; n of them for n > 1)."""

    sampling: SamplingParams
    logit: LogitParams
    counts: TokenCounts
    gen: torch.Generator = field(repr=False)

    @classmethod
    def new(
        cls, sampling: SamplingParams, logit: LogitParams, vocab: int, device: torch.device | str
    ) -> ChoiceRow:
        return cls(sampling, logit, TokenCounts(vocab, device), sampling.generator())


@dataclass
class Chosen:
    """The token a row chose, with its logprob and top alternatives when asked for."""

    token: int
    logprob: float | None = None  # None unless the row asked for logprobs
    top: list[tuple[int, float]] = field(default_factory=list)  # (id, logprob), most likely first


def choose_tokens(logits: torch.Tensor, rows: Sequence[ChoiceRow]) -> list[Chosen]:
    """Choose one token per row from logits (B, V); updates each row's counts and generator."""
    if logits.shape[0] != len(rows):
        raise ValueError("choose_tokens needs one row of logits per ChoiceRow")
    processed = process(logits, [r.logit for r in rows], [r.counts for r in rows])  # (B, V)
    out = [Chosen(sample_token(processed[i], r.sampling, r.gen)) for i, r in enumerate(rows)]
    want = [i for i, r in enumerate(rows) if r.logit.logprobs]
    if want:
        k = max(rows[i].logit.top_logprobs for i in want)
        chosen = torch.tensor([out[i].token for i in want])  # (b,)
        lp = logprobs(processed[want], chosen, k)
        for j, i in enumerate(want):
            out[i].logprob = float(lp.chosen[j])
            ki = rows[i].logit.top_logprobs
            out[i].top = list(
                zip(lp.top_ids[j, :ki].tolist(), lp.top_logprobs[j, :ki].tolist(), strict=True)
            )
    for c, r in zip(out, rows, strict=True):
        r.counts.add(c.token)
    return out
