"""Sampling of the next token and stopping rules of a generation.

`SamplingParams` is the engine-side form of a request's options (temperature 0 = greedy,
top_k 0 = off, top_p 1 = off, seed for reproducibility, stop strings, max tokens). Each
generation owns a `torch.Generator` seeded from its seed, so its tokens depend only on its own
logits and seed, never on which other sessions shared its batches. `StopMatcher` holds back
text that might be the start of a stop string so streamed text never includes one.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy (argmax); otherwise logits are divided by it
    top_k: int = 0  # keep the k most likely tokens (0 = all)
    top_p: float = 1.0  # keep the smallest set with probability mass >= top_p (1 = all)
    seed: int | None = None  # None: a random seed is drawn (and reported)
    max_tokens: int = 16  # generation stops after this many tokens
    stop: list[str] = field(default_factory=list)  # generation stops when one of them appears

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        if self.seed is None:
            self.seed = secrets.randbits(52)  # exact in JSON doubles too
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")

    def generator(self) -> torch.Generator:
        g = torch.Generator(device="cpu")
        g.manual_seed(int(self.seed))
        return g


def sample_token(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> int:
    """Draw one token id from logits (V,) (any float dtype, any device)."""
    logits = logits.detach().to("cpu", torch.float64)  # (V,)
    if not torch.isfinite(logits).any():
        raise ValueError("the model produced no finite logits")
    if params.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits / params.temperature  # (V,)
    if params.top_k and params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = torch.where(scaled < kth, float("-inf"), scaled)
    probs = torch.softmax(scaled, dim=-1)  # (V,)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)  # (V,)
        before = torch.cumsum(sorted_p, 0) - sorted_p  # mass of strictly more likely tokens
        keep = before < params.top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, 0.0)
    cdf = torch.cumsum(probs, 0)  # (V,)
    u = torch.rand((), generator=gen, dtype=torch.float64) * cdf[-1]
    idx = int(torch.searchsorted(cdf, u.reshape(1), right=True)[0])
    return min(idx, probs.numel() - 1)


class StopMatcher:
    """Streams text while watching for stop strings.

    `feed(piece)` returns (text safe to emit now, stopped). Text that could still become a stop
    string is held back; on a stop the text before the stop string is returned and the rest is
    dropped. `flush()` returns what was held back once the generation ends without a stop.
    """

    def __init__(self, stop: list[str]) -> None:
        self.stop = list(stop)
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stop:
            return piece, False
        text = self._held + piece
        hits = [(text.find(s), s) for s in self.stop if s in text]
        if hits:
            pos = min(h[0] for h in hits)
            self._held, self.stopped = "", True
            return text[:pos], True
        keep = 0  # longest suffix of text that is a proper prefix of a stop string
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        out, self._held = self._held, ""
        return out
