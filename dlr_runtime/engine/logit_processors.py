"""Logit processors of the OpenAI surface, batched per row: penalties, logit_bias, logprobs.

Each batched function works on a (B, V) block of logits where every row belongs to its own
request with its own options; each has a plain per-row `*_ref` twin (Python loops, float64)
that the tests compare against.

- presence / frequency penalties (OpenAI's definition, over the tokens generated so far, as vLLM
  does; the prompt does not count):
      logits[j] -= frequency_penalty * count[j] + presence_penalty * (count[j] > 0)
- logit_bias: a per-token additive bias (OpenAI: values in [-100, 100]; -100 bans a token).
- logprobs: log-softmax of the processed logits (after penalties and bias, before temperature,
  top-k and top-p), the chosen token's value and the `top_logprobs` most likely tokens.

`TokenCounts` keeps one request's generated-token counts (V,) as it decodes; `LogitParams` is
the engine-side form of a request's options (converted from the request model at the server's
boundary).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

MAX_TOP_LOGPROBS = 20  # as OpenAI's API


@dataclass
class LogitParams:
    presence_penalty: float = 0.0  # in [-2, 2]; subtracted once from every token already generated
    frequency_penalty: float = 0.0  # in [-2, 2]; subtracted per occurrence of a generated token
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> bias in [-100, 100]
    logprobs: bool = False  # report the chosen token's logprob
    top_logprobs: int = 0  # also report this many most likely tokens (0..20)

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {v}")
        for tok, b in self.logit_bias.items():
            if not isinstance(tok, int) or tok < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {tok!r}")
            if not -100.0 <= b <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {b}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]")

    @property
    def changes_logits(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


class TokenCounts:
    """Counts of one request's generated tokens (V,), kept where the logits are."""

    def __init__(self, vocab: int, device: torch.device | str = "cpu") -> None:
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)  # (V,)

    def add(self, token: int) -> None:
        self.counts[token] += 1


def bias_rows(
    biases: Sequence[Mapping[int, float]],
    vocab: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Dense per-row bias (B, V) from each row's {token id: bias}."""
    out = torch.zeros(len(biases), vocab, dtype=dtype)  # (B, V)
    for i, b in enumerate(biases):
        for tok, v in b.items():
            if not 0 <= tok < vocab:
                raise ValueError(f"logit_bias token id {tok} is not in [0, {vocab})")
            out[i, tok] = v
    return out.to(device)


def apply_penalties(
    logits: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> torch.Tensor:
    """logits (B, V) minus each row's penalties; counts (B, V), presence (B,), frequency (B,)."""
    c = counts.to(logits.dtype)  # (B, V)
    f = frequency.to(logits.dtype)[:, None]  # (B, 1)
    p = presence.to(logits.dtype)[:, None]  # (B, 1)
    return logits - f * c - p * (c > 0).to(logits.dtype)  # (B, V)


def process(
    logits: torch.Tensor, params: Sequence[LogitParams], counts: Sequence[TokenCounts]
) -> torch.Tensor:
    """Penalties then bias for a batch of rows, each with its own options (B, V) -> (B, V)."""
    if not any(p.changes_logits for p in params):
        return logits
    dev, vocab, dt = logits.device, logits.shape[-1], logits.dtype
    presence = torch.tensor([p.presence_penalty for p in params], dtype=dt, device=dev)  # (B,)
    frequency = torch.tensor([p.frequency_penalty for p in params], dtype=dt, device=dev)  # (B,)
    stacked = torch.stack([c.counts.to(dev) for c in counts])  # (B, V)
    out = apply_penalties(logits, stacked, presence, frequency)
    if any(p.logit_bias for p in params):
        out = out + bias_rows([p.logit_bias for p in params], vocab, dev, dt)
    return out


@dataclass
class TokenLogprobs:
    """Per row: the chosen token's logprob and the `k` most likely tokens with theirs."""

    chosen: torch.Tensor  # (B,) float32
    top_ids: torch.Tensor  # (B, k) int64, most likely first
    top_logprobs: torch.Tensor  # (B, k) float32


def logprobs(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> TokenLogprobs:
    """Log-softmax of logits (B, V) (in float32); values at `chosen` (B,) and the top `k`."""
    lp = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
    picked = lp.gather(1, chosen.to(lp.device).long()[:, None])[:, 0]  # (B,)
    top = torch.topk(lp, k, dim=-1) if k else None
    if top is None:
        empty = torch.zeros(lp.shape[0], 0)
        return TokenLogprobs(picked, empty.long(), empty)
    return TokenLogprobs(picked, top.indices, top.values)


# ------------------------------------------------------------------ plain references
def process_ref(logits: list[float], params: LogitParams, generated: Sequence[int]) -> list[float]:
    """One row, float64 Python loop: penalties over `generated`, then the bias."""
    out = [float(x) for x in logits]
    for j in range(len(out)):
        n = sum(1 for t in generated if t == j)
        out[j] -= params.frequency_penalty * n + (params.presence_penalty if n else 0.0)
        out[j] += params.logit_bias.get(j, 0.0)
    return out


def logprobs_ref(logits: list[float], chosen: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """One row, float64: chosen token's logprob and the top k (id, logprob), ties by lower id."""
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    lps = [x - lse for x in logits]
    order = sorted(range(len(lps)), key=lambda j: (-lps[j], j))[:k]
    return lps[chosen], [(j, lps[j]) for j in order]
