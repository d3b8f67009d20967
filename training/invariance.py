"""A penalty on how much of the classifier's features the voice's domain explains.

A keyword spotter trained on a few synthesizers learns their signatures along with the words;
an unheard synthesizer then looks like none of them and its commands fall to ``_unknown_``
(the speech card's leave-one-synthesizer-out folds). This penalty asks the features that the
classifier scores to look the same whichever engine said the word: over the frames
of a batch that belong to a word (``KWSItem.domains``), it is the share of the features' variance
that lies *between* the domains' means,

    between = mean over groups g of  sum_k n_gk ||mu_gk - mu_g||^2 / sum_k n_gk
    penalty = between / (total variance of those frames)

where k runs over the domains present in group g, mu_gk is the mean feature of domain k's frames
in g and mu_g the frame-weighted mean of g. Without ``classwise`` there is one group (every word
frame); with it, one group per word label, so "yes" from one engine is compared with "yes" from
the others and the words' own differences are left alone. Groups with fewer than two domains add
nothing. The ratio is 0 when every domain has the same mean (at most 1 with one group);
dividing by the total variance means shrinking the features cannot lower it.

Moment matching of this kind (CORAL, Sun & Saenko 2016, matches means and covariances) has no
parameters and no min-max game. A domain classifier trained against the network through a
reversed gradient (DANN, Ganin & Lempitsky 2015) was tried first on the linear problem of this
module's tests and did not hide the domain there: the game pushed the domains' features apart
instead, and a fresh linear probe still read the domain. The penalty is training only: the
model and every runtime form are unchanged.

The domain is the engine, not the speaker: a batch holds a few words per speaker, so the
speakers' means would differ mostly by which words each said, and the penalty would pull the
words together instead of the voices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.data.sc12 import IGNORE


@dataclass(frozen=True)
class InvarianceConfig:
    """The penalty of a run; ``weight`` 0 turns it off."""

    weight: float = 0.0
    classwise: bool = False  # compare the engines within each word label

    @property
    def active(self) -> bool:
        return self.weight > 0

    def check(self) -> None:
        if not self.weight >= 0:
            raise ValueError(f"--invariance-weight must be >= 0, got {self.weight}")


def domain_share(
    feats: torch.Tensor, domains: torch.Tensor, groups: torch.Tensor | None = None
) -> torch.Tensor:
    """The share of the features' variance between the domains' means (see the module doc).

    feats (B, F, H), domains (B, F) int64 (IGNORE: not a word frame), groups (B, F) int64 or
    None (one group) -> scalar in [0, 1]; 0 (still attached to `feats`) without two domains."""
    keep = domains != IGNORE  # (B, F)
    z = feats[keep]  # (K, H)
    zero = feats.sum() * 0.0
    if z.shape[0] < 2:
        return zero
    d = domains[keep]  # (K,)
    g = groups[keep] if groups is not None else torch.zeros_like(d)  # (K,)
    n_dom = int(d.max()) + 1
    cell = g * n_dom + d  # (K,): one id per (group, domain)
    cells, cell_of = torch.unique(cell, return_inverse=True)  # (C,), (K,)
    count = torch.bincount(cell_of, minlength=len(cells)).to(z.dtype)  # (C,)
    sums = torch.zeros(len(cells), z.shape[1], dtype=z.dtype, device=z.device)
    sums = sums.index_add(0, cell_of, z)  # (C, H)
    mu = sums / count.unsqueeze(1)  # (C, H): mean of each (group, domain)
    cell_group = cells // n_dom  # (C,)
    grp, grp_of = torch.unique(cell_group, return_inverse=True)  # (G,), (C,)
    n_cells = torch.bincount(grp_of, minlength=len(grp))  # domains per group
    g_count = torch.zeros(len(grp), dtype=z.dtype, device=z.device).index_add(0, grp_of, count)
    g_sum = torch.zeros(len(grp), z.shape[1], dtype=z.dtype, device=z.device)
    g_mu = g_sum.index_add(0, grp_of, sums) / g_count.unsqueeze(1)  # (G, H)
    spread = count * ((mu - g_mu[grp_of]) ** 2).sum(-1)  # (C,)
    between = torch.zeros(len(grp), dtype=z.dtype, device=z.device).index_add(0, grp_of, spread)
    between = between / g_count  # (G,): per-frame between-domain variance of each group
    usable = n_cells >= 2
    if not bool(usable.any()):
        return zero
    total = ((z - z.mean(0)) ** 2).sum(-1).mean()
    return between[usable].mean() / total.clamp_min(torch.finfo(z.dtype).tiny)
