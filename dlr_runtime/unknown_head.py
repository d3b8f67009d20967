"""A classifier projection whose last label is the union of several classes.

A keyword spotter's ``_unknown_`` label covers hundreds of different words. With one row of the
projection it is one linear region of the feature space, which must hold every word that is not
a command at once. With ``DLRConfig.unknown_classes = K`` the projection has K rows for it
instead (one per word of the training vocabulary, say), and the label's score is their union:

    scores[..., :C-1] = W[:C-1] f + b[:C-1]                 (the other labels, as before)
    scores[..., C-1]  = log sum_k exp(W[C-1+k] f + b[C-1+k])  (the union of the K classes)

so softmax(scores) is exactly the K+C-1-way softmax with the K classes' probabilities summed:
everything downstream (decision rules, thresholds, the server) sees C labels as before. The
parameters keep `nn.Linear`'s names and layout (weight (C-1+K, H), bias (C-1+K,)), so checkpoints
and every form of the runtime that calls the projection stay as they are; `fine` gives the
K+C-1 per-class logits a training loss needs. A model with K = 1 computes what a plain
projection computes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

RULES = ("sum", "max")  # how the union's classes make the label's score


class UnionLinear(nn.Linear):
    """Linear map to `n_labels - 1 + union` logits; the last `union` are scored as one label:
    by their logsumexp (`rule` "sum", the union's probability), or by the largest ("max", its
    most likely class alone: a probe of the decision rule, not a stored setting)."""

    def __init__(self, in_features: int, n_labels: int, union: int, rule: str = "sum") -> None:
        if union < 1 or n_labels < 2:
            raise ValueError(
                f"UnionLinear needs n_labels >= 2 and union >= 1, got {n_labels}, {union}"
            )
        if rule not in RULES:
            raise ValueError(f"UnionLinear rule must be one of {RULES}, got {rule!r}")
        super().__init__(in_features, n_labels - 1 + union)
        self.n_labels, self.union, self.rule = n_labels, union, rule

    def fine(self, f: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., n_labels - 1 + union): every class's own logit."""
        return super().forward(f)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., n_labels): the union's classes as one label (their logsumexp)."""
        return group(self.fine(f), self.n_labels, self.rule)


def group(fine: torch.Tensor, n_labels: int, rule: str = "sum") -> torch.Tensor:
    """Per-class logits (..., n_labels - 1 + K) -> label scores (..., n_labels)."""
    head, union = fine[..., : n_labels - 1], fine[..., n_labels - 1 :]
    if rule == "max":
        return torch.cat([head, union.max(dim=-1, keepdim=True).values], -1)
    return torch.cat([head, torch.logsumexp(union, dim=-1, keepdim=True)], -1)


@torch.no_grad()
def split_last_row(proj: nn.Linear, union: int) -> UnionLinear:
    """A `UnionLinear` with `union` copies of `proj`'s last row and the same scores: each copy's
    bias is lowered by log(union), so the copies' logsumexp is the original row's logit."""
    n_labels, h = proj.out_features, proj.in_features
    out = UnionLinear(h, n_labels, union).to(proj.weight.dtype)
    out.weight[: n_labels - 1] = proj.weight[:-1]
    out.bias[: n_labels - 1] = proj.bias[:-1]
    out.weight[n_labels - 1 :] = proj.weight[-1]
    out.bias[n_labels - 1 :] = proj.bias[-1] - math.log(union)
    return out
