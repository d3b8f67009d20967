"""Causal feature normalisation: each front-end feature minus its exponentially weighted mean.

With ``DLRConfig.feature_norm_s = tau > 0`` the audio encoder maps the normalised features

    g_t = f_t - M_t / K_t,   M_t = a M_{t-1} + f_t,   K_t = a K_{t-1} + 1,   a = exp(-frame_s / tau)

(M_{-1} = 0, K_{-1} = 0), not f_t, through its frame map. On a log-mel front end this is
cepstral-mean-style normalisation done causally: a fixed channel (a microphone's or a
synthesizer's spectral tilt, a telephone band) is a constant added to every log-mel band, and
the running mean takes it out after ~tau seconds. It is the classifier head's pooling recurrence
(`heads.pool_*`) run over the front-end features, so the state is two more fixed-size tensors
beside the head's: "feat_sum" (B, F) and "feat_count" (B,), float64, F = ``config.feature_dim``.

- `normalise(f, decay)`: offline, from an empty state (training; any dtype).
- `normalise_chunk(f, s, c, decay)`: T frames from a state, float64 in the state; the same
  numbers as `normalise_step` applied T times.
- `normalise_step(f, s, c, decay)`: one frame per stream.

A stream that starts fresh (or that a voice-activity gate restarts, `vad.py`) starts its mean
from its first frame (g_0 = 0), exactly as in training windows.
"""

from __future__ import annotations

import math

import torch

from .config import DLRConfig
from .heads import pool_chunk, pool_step, pooled


def norm_decay(cfg: DLRConfig) -> float:
    """The per-frame decay a of `cfg`'s feature normalisation (0.0 when it is off)."""
    if cfg.feature_norm_s <= 0:
        return 0.0
    return math.exp(-cfg.frame_stride / cfg.sample_rate / cfg.feature_norm_s)


def normalise(f: torch.Tensor, decay: float) -> torch.Tensor:
    """Features f (B, T, F) -> normalised features (B, T, F), from an empty state."""
    return f - pooled(f, decay)


def normalise_chunk(
    f: torch.Tensor, s0: torch.Tensor, c0: torch.Tensor, decay: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """f (B, T, F) from sums s0 (B, F), counts c0 (B,) -> (normalised (B, T, F) in f's dtype,
    new sums (B, F), new counts (B,)); the mean runs in float64."""
    if f.shape[1] == 0:
        return f, s0, c0
    sums, counts = pool_chunk(f.double(), s0, c0, decay)  # (B, T, F), (B, T)
    mean = sums / counts.unsqueeze(-1)
    return (f.double() - mean).to(f.dtype), sums[:, -1], counts[:, -1]


def normalise_step(
    f: torch.Tensor, s: torch.Tensor, c: torch.Tensor, decay: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One frame f (B, F) from sums s (B, F), counts c (B,) -> (normalised (B, F), s, c)."""
    s, c = pool_step(s, c, f.double(), decay)
    return (f.double() - s / c.unsqueeze(-1)).to(f.dtype), s, c
