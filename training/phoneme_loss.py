"""An auxiliary phoneme loss for the keyword spotter: CTC on the words' phonemes (training only).

The kws recipe's classes fold 476 different words into ``_unknown_`` and give a voice's command
one label, so nothing asks the network what was said beyond "which of twelve". A second linear
head on the last block's per-frame features (before the classifier's pooling) is trained with
connectionist temporal classification (Graves et al., 2006; ``torch.nn.functional.ctc_loss``)
to emit the phonemes of every word in a training window, in order (``data/phonemes.py``). The
phonemes recur across hundreds of words and every voice, and an engine's signature predicts none
of them: the aim is features that say what was said rather than who said it, for voices and
engines never heard in training. The head is not part of the model: the checkpoint, the
recurrent form and the server are unchanged, and it is dropped after training.

A window whose word is cut by the window's edge (its start before the window, or its end after
it) has no usable phoneme target and is left out of this loss (``n_phones`` -1); a window with
no word has an empty target (every frame blank).

:func:`ctc_reference` is a plain loop over the CTC forward recursion, the tests' check on the
wrapper's masking and normalisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.data.phonemes import BLANK


@dataclass(frozen=True)
class PhonemeLossConfig:
    weight: float = 0.0  # added to the loss times the mean per-phoneme CTC loss; 0 = off

    @property
    def active(self) -> bool:
        return self.weight > 0

    def check(self) -> None:
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"--phoneme-loss-weight must be >= 0, got {self.weight}")


class PhonemeHead(nn.Module):
    """Per-frame features (B, F, H) -> phoneme log-probabilities (B, F, P + 1), blank = 0."""

    def __init__(self, d_model: int, n_classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, n_classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.proj(h).float(), dim=-1)


def phoneme_ctc_loss(
    log_probs: torch.Tensor, phones: torch.Tensor, n_phones: torch.Tensor
) -> torch.Tensor:
    """Mean over the usable windows of each window's CTC loss divided by its phoneme count.

    log_probs (B, T, C) log-softmax over phonemes + blank; phones (B, S) ids, padded;
    n_phones (B,) target lengths, -1 for a window left out. 0 (with a graph) if none is usable.
    """
    use = n_phones >= 0  # (B,)
    if not bool(use.any()):
        return log_probs.sum() * 0.0
    lp = log_probs[use]  # (b, T, C)
    lengths = n_phones[use]  # (b,)
    t = torch.full((lp.shape[0],), lp.shape[1], dtype=torch.long, device=lp.device)
    per = F.ctc_loss(
        lp.transpose(0, 1),  # (T, b, C)
        phones[use],
        t,
        lengths,
        blank=BLANK,
        reduction="none",
        zero_infinity=True,
    )  # (b,)
    return (per / lengths.clamp(min=1).to(per.dtype)).mean()


def ctc_reference(log_probs: torch.Tensor, target: list[int], blank: int = BLANK) -> torch.Tensor:
    """-log p(target | log_probs (T, C)) by the plain CTC forward recursion (one window)."""
    ext = [blank]
    for p in target:
        ext += [p, blank]
    neg = torch.tensor(-math.inf, dtype=log_probs.dtype)
    alpha = [neg] * len(ext)
    alpha[0] = log_probs[0, blank]
    if len(ext) > 1:
        alpha[1] = log_probs[0, ext[1]]
    for step in range(1, log_probs.shape[0]):
        new = []
        for s, sym in enumerate(ext):
            terms = [alpha[s]]
            if s >= 1:
                terms.append(alpha[s - 1])
            if s >= 2 and sym != blank and sym != ext[s - 2]:
                terms.append(alpha[s - 2])
            new.append(torch.logsumexp(torch.stack(terms), 0) + log_probs[step, sym])
        alpha = new
    ends = [alpha[-1]] + ([alpha[-2]] if len(ext) > 1 else [])
    return -torch.logsumexp(torch.stack(ends), 0)
