"""A fused CPU kernel for one diagonal layer over a short block: the audio chunk's hot loop.

A 100 ms audio chunk is a handful of frames (5 at a 20 ms stride). For blocks that short the
torch chunk form (`diagonal.diag_block`: Toeplitz convolution, a contraction of the state with
the lambda powers, then `lam^T x0 + acc`) is a few tiny batched matmuls that read and copy the
(B, H, N) complex state several times. `ssm_block` instead runs the recurrence itself, one
(session, feature) row at a time, with the row's N states in L1 cache for the whole block:

    x_t = lam * x_{t-1} + b * u_t            (complex, per state n)
    y_t = Re(sum_n c_n x_t[n]) + d * u_t

so the state is read once and written once per block. Each row is computed alone, in the same
order whatever the batch, so batching never changes a session's output (bit for bit).

`ssm_block_ref` is the plain-torch twin (the reference loop the tests compare against: float64
to 1e-10, float32 to 1e-5). The kernel needs numba (`fused_kernel.AVAILABLE`); it compiles on
first use and is cached on disk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .fused_kernel import AVAILABLE, numba


@dataclass(frozen=True)
class LayerPlanes:
    """One layer's complex weights as real (re, im) planes, broadcast to (H, N), contiguous."""

    lam_re: np.ndarray  # (H, N)
    lam_im: np.ndarray
    c_re: np.ndarray  # (H, N)
    c_im: np.ndarray
    b_re: np.ndarray  # (H, N) (ones / zeros when B = 1: the kernel skips the product)
    b_im: np.ndarray
    b_is_one: bool
    d: np.ndarray  # (H,)


def layer_planes(
    lam: torch.Tensor, c: torch.Tensor, d: torch.Tensor, b: torch.Tensor | None, rdtype: torch.dtype
) -> LayerPlanes:
    """Planes of a layer's lam (H, N) or (N,), c (H, N), d (H,), b (H, N) or None (B = 1)."""
    h, n = c.shape

    def planes(t: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        t = torch.broadcast_to(t.detach().cpu(), (h, n))
        return t.real.to(rdtype).contiguous().numpy(), t.imag.to(rdtype).contiguous().numpy()

    lr, li = planes(lam)
    cr, ci = planes(c)
    br, bi = planes(torch.ones_like(c) if b is None else b)
    return LayerPlanes(lr, li, cr, ci, br, bi, b is None, d.detach().cpu().to(rdtype).numpy())


# ---------------------------------------------------------------------- the plain twin
def ssm_block_ref(
    u: torch.Tensor,
    x0: torch.Tensor,
    lam: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    b: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """u (B, T, H) real, x0 (B, H, N) complex -> (y (B, T, H), x_end (B, H, N)), step by step."""
    x = x0
    ys = []
    for t in range(u.shape[1]):
        ut = u[:, t].unsqueeze(-1)  # (B, H, 1)
        x = lam * x + (ut if b is None else b * ut)
        ys.append((c * x).real.sum(-1) + d * u[:, t])
    y = torch.stack(ys, 1) if ys else u.new_zeros(u.shape)
    return y, x


# ---------------------------------------------------------------------- the kernel
if AVAILABLE:

    @numba.njit(cache=True, fastmath=True, nogil=True)
    def _ssm_block(
        u, x0, lr, li, cr, ci, br, bi, b_is_one, d, x_out, y
    ):  # pragma: no cover - compiled
        """u (B, T, H); x0, x_out (B, H, N) complex; weight planes (H, N); d (H,); y (B, T, H).
        The row's state is unpacked into two real arrays so the inner loop vectorises."""
        bsz, t, h = u.shape
        n = x0.shape[2]
        ar = np.empty(n, lr.dtype)
        ai = np.empty(n, lr.dtype)
        for r in range(bsz):
            for k in range(h):
                for m in range(n):
                    v = x0[r, k, m]
                    ar[m] = v.real
                    ai[m] = v.imag
                for s in range(t):
                    uk = u[r, s, k]
                    acc = 0.0
                    if b_is_one:
                        for m in range(n):
                            a, q = ar[m], ai[m]
                            nr = lr[k, m] * a - li[k, m] * q + uk
                            ni = lr[k, m] * q + li[k, m] * a
                            ar[m] = nr
                            ai[m] = ni
                            acc += cr[k, m] * nr - ci[k, m] * ni
                    else:
                        for m in range(n):
                            a, q = ar[m], ai[m]
                            nr = lr[k, m] * a - li[k, m] * q + br[k, m] * uk
                            ni = lr[k, m] * q + li[k, m] * a + bi[k, m] * uk
                            ar[m] = nr
                            ai[m] = ni
                            acc += cr[k, m] * nr - ci[k, m] * ni
                    y[r, s, k] = acc + d[k] * uk
                for m in range(n):
                    x_out[r, k, m] = complex(ar[m], ai[m])


def ssm_block(
    u: torch.Tensor, x0: torch.Tensor, w: LayerPlanes, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ssm_block_ref` in one compiled call (CPU tensors). x_end is written into `out` when
    given ((B, H, N), a view such as `state[:, i]` is fine; it must not alias x0)."""
    if not AVAILABLE:
        raise RuntimeError("the fused block needs numba (pip install numba)")
    bsz, t, h = u.shape
    dest = torch.empty_like(x0) if out is None else out
    y = np.empty((bsz, t, h), dtype=w.lam_re.dtype)
    _ssm_block(
        u.detach().contiguous().numpy(), x0.detach().numpy(), w.lam_re, w.lam_im, w.c_re,
        w.c_im, w.b_re, w.b_im, w.b_is_one, w.d, dest.numpy(), y,
    )  # fmt: skip
    return torch.from_numpy(y), dest
