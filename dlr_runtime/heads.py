"""Pooling of the classifier head: a running mean, or an exponentially weighted mean.

The classifier scores the pooled features p_t = S_t / C_t with

    S_t = a S_{t-1} + f_t,   C_t = a C_{t-1} + 1,   S_{-1} = 0, C_{-1} = 0

- a = 1 (``pool_window_s = 0``, the paper's setting): the mean over everything since the stream
  started; right for one utterance per stream.
- a = exp(-frame_s / pool_window_s) < 1: a normalised exponential window with time constant
  ``pool_window_s``; the head says what was heard in the last ~``pool_window_s`` seconds and
  forgets what came before, so a continuous stream stays meaningful. The state is the same two
  fixed-size tensors (``mean_sum`` (B, H), ``mean_count`` (B,)) and ``scores`` is unchanged.

`pool_chunk` gives the same numbers as `pool_step` applied T times (a Toeplitz matmul per block
of `BLOCK` frames, float64 in the state, any dtype offline for training).
"""

from __future__ import annotations

import math

import torch

from .config import DLRConfig

BLOCK = 128  # frames per Toeplitz block in pool_chunk


def pool_decay(cfg: DLRConfig) -> float:
    """The per-frame decay a of `cfg` (1.0 for the running mean)."""
    if cfg.pool_window_s <= 0:
        return 1.0
    frame_s = cfg.frame_stride / cfg.sample_rate
    return math.exp(-frame_s / cfg.pool_window_s)


def pool_step(
    s: torch.Tensor, c: torch.Tensor, f: torch.Tensor, decay: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One frame: sums s (B, H), counts c (B,), features f (B, H) -> new (s, c)."""
    if decay == 1.0:
        return s + f, c + 1
    return decay * s + f, decay * c + 1


def pool_chunk(
    f: torch.Tensor, s0: torch.Tensor, c0: torch.Tensor, decay: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features f (B, T, H) from sums s0 (B, H), counts c0 (B,) -> sums (B, T, H), counts (B, T).

    Runs in the dtype of f (s0/c0 are cast to it); the recurrent form passes float64.
    """
    t_len = f.shape[1]
    if decay == 1.0:
        steps = torch.arange(1, t_len + 1, device=f.device, dtype=f.dtype)
        return s0.to(f.dtype).unsqueeze(1) + torch.cumsum(f, dim=1), c0.to(f.dtype).unsqueeze(
            1
        ) + steps
    sums, counts = [], []
    s, c = s0.to(f.dtype), c0.to(f.dtype)
    for start in range(0, t_len, BLOCK):
        blk = f[:, start : start + BLOCK]  # (B, T', H)
        n = blk.shape[1]
        idx = torch.arange(n, device=f.device)
        lag = (idx.view(-1, 1) - idx.view(1, -1)).to(torch.float64)  # (T', T'): t - s
        w = torch.where(lag >= 0, decay ** lag.clamp(min=0), 0.0).to(f.dtype)  # a^(t-s), s <= t
        carry = (decay ** (idx.to(torch.float64) + 1)).to(f.dtype)  # a^(t+1)  (T',)
        bs = torch.einsum("ts,bsh->bth", w, blk) + carry.view(1, -1, 1) * s.unsqueeze(1)
        bc = w.sum(-1).unsqueeze(0) + carry.unsqueeze(0) * c.unsqueeze(1)  # (B, T')
        sums.append(bs)
        counts.append(bc)
        s, c = bs[:, -1], bc[:, -1]
    return torch.cat(sums, dim=1), torch.cat(counts, dim=1)


def pooled(f: torch.Tensor, decay: float) -> torch.Tensor:
    """Offline pooled features (B, T, H) of f (B, T, H) from an empty state."""
    b, _, h = f.shape
    sums, counts = pool_chunk(f, f.new_zeros(b, h), f.new_zeros(b), decay)
    return sums / counts.unsqueeze(-1)
