"""Per-channel energy normalisation (PCEN) of mel energies, causal and trainable.

Wang et al. (2017), "Trainable frontend for robust and far-field keyword spotting": instead of
``log(E)``, each mel band's energy E_t is divided by a power of its own smoothed past and then
root-compressed,

    PCEN(E_t) = (E_t / (eps + M_t)^alpha + delta)^r - delta^r,   M_t = S_t / K_t,
    S_t = a S_{t-1} + E_t,   K_t = a K_{t-1} + 1,   a = exp(-frame_s / PCEN_S)

with (S_{-1}, K_{-1}) = 0, so M_t is the normalised exponential mean of the band so far (the
classifier head's pooling recurrence, `heads.pool_*`, run over the energies; a stream starts
from its first frame, M_0 = E_0, exactly as a training window does). Dividing by M_t^alpha is an
automatic gain control per band: a loud or quiet talker, a microphone's or a synthesizer's
spectral tilt, are divided out after ~PCEN_S seconds; the offset delta and root r compress
stationary background towards a constant while onsets above it stand out. alpha, delta and r
are learnt per band (kept positive through their logarithms), initialised at the paper's
values; the smoother's time constant is fixed, so the state is two fixed-size tensors:
"pcen_sum" (B, M) and "pcen_count" (B,), float64.

With ``with_log`` (the ``logmel_pcen`` front end) every output is the band's log-mel feature
(`frontend.log_compress`, exactly the ``logmel`` front end's) followed by its PCEN feature,
(..., 2M): a classifier sees both compressions, and a ``logmel`` model's frame projection widened
with zero columns for the PCEN half computes exactly what it did (`training/widen_frontend.py`).

- `PCEN.forward(e)`: offline, from an empty state (training; any dtype).
- `PCEN.chunk(e, s, c)`: T frames from a state, the smoother in float64; the same numbers as
  `PCEN.step` applied T times.
- `PCEN.step(e, s, c)`: one frame per stream.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import DLRConfig
from .frontend import log_compress
from .heads import pool_chunk, pool_step, pooled

PCEN_S = 0.4  # s: the smoother's time constant (the paper's s = 0.025 per 10 ms frame)
PCEN_EPS = 1e-6  # floor of the smoothed energy (digital silence)
INIT_ALPHA = 0.98  # gain normalisation strength
INIT_DELTA = 2.0  # offset before the root
INIT_R = 0.5  # root compression


def pcen_decay(cfg: DLRConfig) -> float:
    """The per-frame decay a of the PCEN smoother (0.0 when the front end is not PCEN)."""
    if not cfg.has_pcen:
        return 0.0
    return math.exp(-cfg.frame_stride / cfg.sample_rate / PCEN_S)


class PCEN(nn.Module):
    """Mel energies (B, [T,] M) -> PCEN features (B, [T,] M), or with `with_log` the log-mel
    features and the PCEN ones side by side (B, [T,] 2M)."""

    def __init__(self, n_mels: int, decay: float, with_log: bool = False) -> None:
        super().__init__()
        self.decay = decay
        self.with_log = with_log
        self.out_dim = 2 * n_mels if with_log else n_mels
        self.log_alpha = nn.Parameter(torch.full((n_mels,), math.log(INIT_ALPHA)))
        self.log_delta = nn.Parameter(torch.full((n_mels,), math.log(INIT_DELTA)))
        self.log_r = nn.Parameter(torch.full((n_mels,), math.log(INIT_R)))

    def compress(self, e: torch.Tensor, smooth: torch.Tensor) -> torch.Tensor:
        """Energies e and their smoothed past (..., M), one dtype -> PCEN (..., M), or
        [log-mel, PCEN] (..., 2M) with `with_log`."""
        alpha = self.log_alpha.exp().to(e.dtype)
        delta = self.log_delta.exp().to(e.dtype)
        r = self.log_r.exp().to(e.dtype)
        gain = torch.exp(-alpha * torch.log(PCEN_EPS + smooth))  # (eps + M)^-alpha
        out = (e * gain + delta).pow(r) - delta.pow(r)
        return torch.cat([log_compress(e), out], dim=-1) if self.with_log else out

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        """Offline: energies of whole streams (B, T, M) from their start -> (B, T, out_dim);
        never under a half-precision autocast (energies span decades: float32 at least)."""
        with torch.autocast(device_type=e.device.type, enabled=False):
            if e.dtype in (torch.float16, torch.bfloat16):
                e = e.float()
            return self.compress(e, pooled(e, self.decay))

    def chunk(
        self, e: torch.Tensor, s0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """e (B, T, M) from sums s0 (B, M), counts c0 (B,) -> (features (B, T, out_dim) in e's
        dtype, new sums (B, M), new counts (B,)); the smoother and the compression run in
        float64."""
        if e.shape[1] == 0:
            return e.new_zeros(*e.shape[:2], self.out_dim), s0, c0
        sums, counts = pool_chunk(e.double(), s0, c0, self.decay)  # (B, T, M), (B, T)
        out = self.compress(e.double(), sums / counts.unsqueeze(-1))
        return out.to(e.dtype), sums[:, -1], counts[:, -1]

    def step(
        self, e: torch.Tensor, s: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One frame e (B, M) from sums s (B, M), counts c (B,) -> (features (B, out_dim), s, c)."""
        s, c = pool_step(s, c, e.double(), self.decay)
        out = self.compress(e.double(), s / c.unsqueeze(-1))
        return out.to(e.dtype), s, c
