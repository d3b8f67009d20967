"""The training-mode causal convolution with a hand-written FFT backward.

`ssm.fft_causal_conv` is the reference: three FFT calls whose backward autograd derives on its
own. That backward goes through complex-to-complex transforms of the padded length and a
zero-filled buffer per call; on the small windows of speech training (B = 32, H = 96,
L = 120 frames) it costs about twice the forward.

`causal_conv` computes the same forward and writes the backward as two more causal
correlations in the frequency domain. With U = rfft(u, 2L), K = rfft(k, 2L), G = rfft(g, 2L)
for the incoming gradient g of y = irfft(U K)[:L]:

    du = irfft(G * conj(K))[:L]                  (the correlation of g with k)
    dk = irfft(sum_batch G * conj(U))[:L]        (the correlation of g with u, summed over
                                                  every leading axis of u, in frequency)

The padded length 2L keeps both correlations free of wrap-around: their outputs at lags
0..L-1 only read the padded spectra's first 2L - 1 samples. The forward keeps U and K for the
backward, so a step runs four real transforms of u's size (rfft u, irfft y, rfft g,
irfft du) and two of k's. It is a first-order function (no double backward), which is all
training needs. `tests/dlr_runtime/test_fft_conv.py` checks values and both gradients against
the reference in float64 (1e-10) and float32, and torch.autograd.gradcheck.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["causal_conv"]


class _CausalConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        length = u.shape[-1]
        n = 2 * length
        uf = torch.fft.rfft(u, n=n)  # (..., H, n/2+1)
        kf = torch.fft.rfft(k, n=n)  # (H, n/2+1)
        ctx.save_for_backward(uf, kf)
        ctx.length = length
        return torch.fft.irfft(uf * kf, n=n)[..., :length]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        uf, kf = ctx.saved_tensors
        length = ctx.length
        n = 2 * length
        gf = torch.fft.rfft(g, n=n)  # (..., H, n/2+1)
        du = dk = None
        if ctx.needs_input_grad[0]:
            du = torch.fft.irfft(gf * kf.conj(), n=n)[..., :length]
        if ctx.needs_input_grad[1]:
            cross = (gf * uf.conj()).reshape(-1, *kf.shape).sum(0)  # (H, n/2+1)
            dk = torch.fft.irfft(cross, n=n)[..., :length]
        return du, dk


def causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal convolution along the last axis: u (..., H, L) with k (H, L) -> (..., H, L);
    the same values as `ssm.fft_causal_conv`, with the backward above."""
    if u.shape[-1] == 0:
        return u.clone()
    if k.shape != u.shape[-2:]:
        raise ValueError(f"kernel {tuple(k.shape)} does not match input {tuple(u.shape)}")
    return _CausalConv.apply(u, k)
