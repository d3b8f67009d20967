"""Diagonal linear recurrences: three parameterisations, one recurrent form.

Every layer here is, at inference, the diagonal complex recurrence

    x_t = lam * x_{t-1} + B * u_t            x in C^{H x N}, u in R^H (broadcast over N)
    y_t = Re(sum_n C[h, n] x_t[h, n]) + D[h] u_t

and, in training, the equivalent causal convolution y = u * K + D u with the kernel
K[h, l] = Re(sum_n C[h, n] B[h, n] lam[h, n]^l).

The layers differ only in how (lam, B, C, D) are parameterised:
- `DLRLayer`: the paper's diagonal linear RNN (Gupta, Mehta, Berant 2022): lam = exp(Lambda)
  with Re Lambda = -p^2, B = 1, C = W. No discretisation. `DLRConfig.min_decay` adds a floor,
  Re Lambda = -(p^2 + min_decay): no mode outlives ~1 / min_decay steps (0: the paper's).
- `S4DLayer`: S4D (Gu et al. 2022): continuous A per feature, ZOH-discretised with a per-feature
  dt; conjugate pairs are stored once, hence C = 2 * C_param.
- `LRULayer`: the Linear Recurrent Unit (Orvieto et al. 2023) with a per-feature diagonal input:
  lam = exp(-exp(nu) + i exp(theta)), B = gamma * B_param with gamma = sqrt(1 - |lam|^2).

`recurrent_params()` returns (log_lam, B, C, D) in float64/complex128; the runtime needs
nothing else, so all three convert to the same recurrent form, whose step and chunk math is
`diagonal.py`.

Precision (dlr.md pitfalls 1 and 8): powers lam^l are formed as exp(l * log_lam) with the phase
product taken in float64 and reduced modulo 2*pi before the exponential, never as repeated
products or float32 phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .config import DLRConfig
from .diagonal import TWO_PI, powers
from .fft_conv import causal_conv

__all__ = ["TWO_PI", "powers"]  # re-exported: the math lives in diagonal.py


@dataclass
class RecurrentParams:
    """The parameterisation-free recurrent form of one layer (all float64 / complex128)."""

    log_lam: torch.Tensor  # (H, N), or (N,) when shared by all features; complex128, Re <= 0
    B: torch.Tensor  # (H, N) complex128 input vector
    C: torch.Tensor  # (H, N) complex128 output vector
    D: torch.Tensor  # (H,) float64 skip


def kernel_from_params(params: RecurrentParams, length: int) -> torch.Tensor:
    """Convolution kernel K[h, l] = Re(sum_n C B lam^l), l < length: (H, length) float64."""
    ls = torch.arange(length, device=params.log_lam.device)
    vand = powers(params.log_lam, ls)  # (H, N, L) or (N, L) when shared
    cb = params.C * params.B  # (H, N)
    if vand.dim() == 2:
        return (cb @ vand).real  # (H, L)
    return (cb.unsqueeze(-1) * vand).sum(dim=-2).real  # (H, L)


def fft_causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal convolution along the last axis: u (..., H, L) with k (H, L) -> (..., H, L).

    The FFT length is 2L >= L + L - 1, so no circular wrap-around reaches the kept outputs.
    This is the reference (autograd derives its backward); `fft_conv.causal_conv`, which
    `DiagonalSSM.forward` calls, gives the same values with a hand-written backward.
    """
    length = u.shape[-1]
    n = 2 * length
    uf = torch.fft.rfft(u, n=n)  # (..., H, n/2+1)
    kf = torch.fft.rfft(k, n=n)  # (H, n/2+1)
    return torch.fft.irfft(uf * kf, n=n)[..., :length]


def _log_uniform(shape: tuple[int, ...], lo: float, hi: float, gen: torch.Generator | None):
    r = torch.rand(shape, generator=gen, dtype=torch.float64)
    return torch.exp(math.log(lo) + r * (math.log(hi) - math.log(lo)))


class DiagonalSSM(nn.Module):
    """Base class: training-mode forward from the kernel of `recurrent_params()`."""

    def __init__(self, cfg: DLRConfig) -> None:
        super().__init__()
        self.d_model = cfg.d_model
        self.d_state = cfg.d_state

    def recurrent_params(self) -> RecurrentParams:  # pragma: no cover - abstract
        raise NotImplementedError

    def kernel(self, length: int) -> torch.Tensor:
        """(H, length) kernel in float64; differentiable."""
        return kernel_from_params(self.recurrent_params(), length)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u (B, L, H) -> y (B, L, H): the whole sequence as one FFT convolution
        (`fft_conv.causal_conv`; `fft_causal_conv` is its reference).

        The result is made contiguous: the position-wise layers after it (GELU and its
        backward above all) run several times slower on the transposed view."""
        p = self.recurrent_params()
        k = kernel_from_params(p, u.shape[1]).to(u.dtype)  # (H, L)
        ut = u.transpose(1, 2)  # (B, H, L)
        y = causal_conv(ut, k) + p.D.to(u.dtype).unsqueeze(-1) * ut  # (B, H, L)
        return y.transpose(1, 2).contiguous()


class DLRLayer(DiagonalSSM):
    """Diagonal linear RNN of the paper: lam = exp(-p^2 + i theta), B = 1, C = W."""

    def __init__(self, cfg: DLRConfig, gen: torch.Generator | None = None) -> None:
        super().__init__(cfg)
        h, n = cfg.d_model, cfg.d_state
        lam_shape = (n,) if cfg.shared_lambda else (h, n)
        dt = _log_uniform(lam_shape, cfg.dt_min, cfg.dt_max, gen)
        if cfg.init == "omega":
            theta = (TWO_PI * torch.arange(n, dtype=torch.float64) / n).expand(lam_shape)
        else:
            theta = TWO_PI * torch.rand(lam_shape, generator=gen, dtype=torch.float64)
        self.min_decay = cfg.min_decay
        self.p = nn.Parameter(torch.sqrt(dt / 2).float())  # Re Lambda = -p^2 = -dt/2 (+ floor)
        self.theta = nn.Parameter(theta.clone().float())  # Im Lambda
        self.W = nn.Parameter(torch.randn(h, n, 2, generator=gen) / n)  # complex C as pairs
        self.D = nn.Parameter(torch.randn(h, generator=gen))

    def recurrent_params(self) -> RecurrentParams:
        log_lam = torch.complex(-(self.p.double() ** 2 + self.min_decay), self.theta.double())
        w = torch.view_as_complex(self.W.double().contiguous())
        return RecurrentParams(
            log_lam=log_lam,
            B=torch.ones_like(w),
            C=w,
            D=self.D.double(),
        )


class S4DLayer(DiagonalSSM):
    """S4D-Lin: A = -1/2 + i pi n per feature, ZOH with per-feature dt, output 2 Re(C x)."""

    def __init__(self, cfg: DLRConfig, gen: torch.Generator | None = None) -> None:
        super().__init__(cfg)
        h, n = cfg.d_model, cfg.d_state
        self.log_dt = nn.Parameter(
            torch.log(_log_uniform((h,), cfg.dt_min, cfg.dt_max, gen)).float()
        )
        self.log_a_real = nn.Parameter(torch.full((h, n), math.log(0.5)))
        if cfg.init == "omega":
            a_imag = math.pi * torch.arange(n, dtype=torch.float32).expand(h, n).clone()
        else:
            a_imag = math.pi * n * torch.rand(h, n, generator=gen)
        self.a_imag = nn.Parameter(a_imag)
        self.B_param = nn.Parameter(torch.stack([torch.ones(h, n), torch.zeros(h, n)], -1))
        self.C_param = nn.Parameter(torch.randn(h, n, 2, generator=gen) * math.sqrt(0.5 / n))
        self.D = nn.Parameter(torch.randn(h, generator=gen))

    def recurrent_params(self) -> RecurrentParams:
        dt = torch.exp(self.log_dt.double()).unsqueeze(-1)  # (H, 1)
        a = torch.complex(-torch.exp(self.log_a_real.double()), self.a_imag.double())  # (H, N)
        dta = dt * a
        b = torch.view_as_complex(self.B_param.double().contiguous())
        c = torch.view_as_complex(self.C_param.double().contiguous())
        return RecurrentParams(
            log_lam=dta,
            B=torch.expm1(dta) / a * b,
            C=2.0 * c,
            D=self.D.double(),
        )


class LRULayer(DiagonalSSM):
    """LRU-style: lam = exp(-exp(nu) + i exp(theta_log)), input scaled by sqrt(1 - |lam|^2)."""

    def __init__(self, cfg: DLRConfig, gen: torch.Generator | None = None) -> None:
        super().__init__(cfg)
        h, n = cfg.d_model, cfg.d_state
        lam_shape = (n,) if cfg.shared_lambda else (h, n)
        dt = _log_uniform(lam_shape, cfg.dt_min, cfg.dt_max, gen)  # -log|lam| = dt / 2
        if cfg.init == "omega":
            theta = (TWO_PI * (torch.arange(n, dtype=torch.float64) + 0.5) / n).expand(lam_shape)
        else:
            theta = TWO_PI * torch.rand(lam_shape, generator=gen, dtype=torch.float64) + 1e-3
        self.nu_log = nn.Parameter(torch.log(dt / 2).float())
        self.theta_log = nn.Parameter(torch.log(theta).clone().float())
        self.B_param = nn.Parameter(torch.randn(h, n, 2, generator=gen) / math.sqrt(2))
        self.C_param = nn.Parameter(torch.randn(h, n, 2, generator=gen) / math.sqrt(2 * n))
        self.D = nn.Parameter(torch.randn(h, generator=gen))

    def recurrent_params(self) -> RecurrentParams:
        nu = torch.exp(self.nu_log.double())
        log_lam = torch.complex(-nu, torch.exp(self.theta_log.double()))
        gamma = torch.sqrt(-torch.expm1(-2.0 * nu))  # sqrt(1 - |lam|^2)
        b = torch.view_as_complex(self.B_param.double().contiguous())
        c = torch.view_as_complex(self.C_param.double().contiguous())
        return RecurrentParams(log_lam=log_lam, B=gamma * b, C=c, D=self.D.double())


LAYER_KINDS: dict[str, type[DiagonalSSM]] = {"dlr": DLRLayer, "s4d": S4DLayer, "lru": LRULayer}


def make_layer(cfg: DLRConfig, gen: torch.Generator | None = None) -> DiagonalSSM:
    return LAYER_KINDS[cfg.layer](cfg, gen)
