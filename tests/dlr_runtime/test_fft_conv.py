"""The causal convolution with the hand-written backward (fft_conv.causal_conv) against its
reference (ssm.fft_causal_conv, autograd's own backward) and a plain loop.

Tolerances (relative to the largest reference value):
- float64: 1e-10 for values and both gradients (observed ~1e-15).
- float32: 2e-5, as the convolution form in test_forms.py (FFT round-off, ~eps * log2(n)).
"""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel
from dlr_runtime.fft_conv import causal_conv
from dlr_runtime.ssm import fft_causal_conv

F64_TOL = 1e-10
F32_TOL = 2e-5


def loop_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """y[..., h, t] = sum_{s <= t} k[h, t - s] u[..., h, s], one position at a time."""
    y = torch.zeros_like(u)
    for t in range(u.shape[-1]):
        for s in range(t + 1):
            y[..., t] = y[..., t] + k[:, t - s] * u[..., s]
    return y


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def grads(fn, u: torch.Tensor, k: torch.Tensor, g: torch.Tensor):
    u, k = u.detach().requires_grad_(), k.detach().requires_grad_()
    y = fn(u, k)
    du, dk = torch.autograd.grad(y, (u, k), g)
    return y.detach(), du, dk


@pytest.mark.parametrize("lead", [(3,), (2, 3), ()])
@pytest.mark.parametrize("length", [1, 2, 7, 64])
def test_values_and_gradients_equal_the_reference_in_float64(lead, length):
    gen = torch.Generator().manual_seed(length)
    h = 5
    u = torch.randn(*lead, h, length, generator=gen, dtype=torch.float64)
    k = torch.randn(h, length, generator=gen, dtype=torch.float64)
    g = torch.randn(*lead, h, length, generator=gen, dtype=torch.float64)
    y_ref, du_ref, dk_ref = grads(loop_conv, u, k, g)
    for fn in (causal_conv, fft_causal_conv):
        y, du, dk = grads(fn, u, k, g)
        assert rel(y, y_ref) < F64_TOL
        assert rel(du, du_ref) < F64_TOL
        assert rel(dk, dk_ref) < F64_TOL


def test_float32_within_the_stated_tolerance():
    gen = torch.Generator().manual_seed(1)
    u = torch.randn(32, 16, 120, generator=gen, dtype=torch.float64)
    k = torch.randn(16, 120, generator=gen, dtype=torch.float64) * 0.1
    g = torch.randn(32, 16, 120, generator=gen, dtype=torch.float64)
    y64, du64, dk64 = grads(fft_causal_conv, u, k, g)
    y, du, dk = grads(causal_conv, u.float(), k.float(), g.float())
    assert y.dtype == du.dtype == dk.dtype == torch.float32
    assert rel(y.double(), y64) < F32_TOL
    assert rel(du.double(), du64) < F32_TOL
    assert rel(dk.double(), dk64) < F32_TOL


def test_gradcheck():
    gen = torch.Generator().manual_seed(2)
    u = torch.randn(2, 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(causal_conv, (u, k))


def test_one_input_without_gradient():
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    (dk,) = torch.autograd.grad(causal_conv(u, k).sum(), (k,))
    (dk_ref,) = torch.autograd.grad(fft_causal_conv(u, k).sum(), (k,))
    assert rel(dk, dk_ref) < F64_TOL
    u.requires_grad_()
    k = k.detach()
    (du,) = torch.autograd.grad(causal_conv(u, k).sum(), (u,))
    (du_ref,) = torch.autograd.grad(fft_causal_conv(u, k).sum(), (u,))
    assert rel(du, du_ref) < F64_TOL


def test_empty_sequence_and_mismatched_kernel():
    assert causal_conv(torch.zeros(2, 3, 0), torch.zeros(3, 0)).shape == (2, 3, 0)
    with pytest.raises(ValueError, match="does not match"):
        causal_conv(torch.zeros(2, 3, 8), torch.zeros(4, 8))


@pytest.mark.parametrize("layer", ["dlr", "s4d", "lru"])
def test_a_network_trains_with_the_same_gradients_as_through_the_reference(layer, monkeypatch):
    """A whole network's parameter gradients through causal_conv equal those through the
    reference convolution, in float64, for every layer kind."""
    cfg = DLRConfig(
        encoder="audio",
        decoder="classifier",
        labels=["a", "b", "c"],
        frame_stride=4,
        d_model=8,
        d_state=6,
        n_layers=2,
        layer=layer,
    )
    model = DLRModel(cfg, seed=0).double()
    audio = torch.randn(3, 4 * 30, generator=torch.Generator().manual_seed(4), dtype=torch.float64)

    def param_grads() -> list[torch.Tensor]:
        model.zero_grad()
        out = model(audio)
        assert out.is_contiguous()
        out.square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    fast = param_grads()
    monkeypatch.setattr("dlr_runtime.ssm.causal_conv", fft_causal_conv)
    ref = param_grads()
    for a, b in zip(fast, ref, strict=True):
        assert rel(a, b) < F64_TOL
