"""The diagonal recurrence of one layer, in step and chunk form, with plain-loop `*_ref` twins.

Every layer kind of `ssm.py` reduces at inference to (lam, B, C, D):

    x_t = lam * x_{t-1} + B * u_t            x in C^{H x N}, u in R^H (broadcast over N)
    y_t = Re(sum_n C[h, n] x_t[h, n]) + D[h] u_t

Chunk form (a block of T inputs with incoming state x0):

    y_t   = (u * K)[t] + Re(sum_n C lam^(t+1) x0) + D u_t,       K[l] = Re(sum_n C B lam^l)
    x_end = lam^T x0 + B sum_s lam^(T-1-s) u_s

i.e. one causal convolution and two Vandermonde products. `chunk_tables` builds every
input-independent table of a block in complex128 (phases wrapped, `powers`); the recurrent
model (`recurrent.py`) and the real-arithmetic export twin (`export/realmath.py`) both lay
these same tables out for their own contractions.

- `diag_step` / `diag_step_ref`: one position for a batch, fast (interleaved real contraction)
  and plain.
- `block_consts` / `diag_block`: one block of T <= max_block positions (Toeplitz matmul for
  short blocks, FFT for long ones).
- `diag_chunk_ref`: the plain time loop, the specification the block form is tested against.

Precision (dlr.md pitfalls 1 and 8): powers lam^l are formed as exp(l * log_lam) with the phase
product taken in float64 and reduced modulo 2*pi before the exponential.
"""

from __future__ import annotations

import math

import torch

TWO_PI = 2.0 * math.pi
TOEPLITZ_MAX = 64  # blocks up to this length convolve by a Toeplitz matmul, longer ones by FFT
FOLD_BYTES = 8 << 20  # fold C into the cached powers while that matrix stays under 8 MiB


def powers(log_lam: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """lam^l for every l in `exponents`, precisely: (..., N) x (T,) -> (..., N, T) complex128.

    The phase Im(log_lam) * l is computed in float64 and wrapped to [0, 2*pi) before cos/sin,
    so the error stays ~1e-16 * |theta * l| instead of float32's ~6e-8 * |theta * l|.
    """
    log_lam = log_lam.to(torch.complex128)
    ex = exponents.to(device=log_lam.device, dtype=torch.float64)  # (T,)
    theta = torch.remainder(log_lam.imag, TWO_PI)  # wrap once: unwrapped theta grows in training
    mag = torch.exp(log_lam.real.unsqueeze(-1) * ex)  # (..., N, T)
    phase = torch.remainder(theta.unsqueeze(-1) * ex, TWO_PI)  # (..., N, T)
    return torch.complex(mag * torch.cos(phase), mag * torch.sin(phase))


def c_pairs(c: torch.Tensor) -> torch.Tensor:
    """C (..., H, N) complex -> (..., H, 2N) real interleaved (re, -im) pairs, so that
    Re(sum_n C x) = <view_as_real(x), pairs> with no complex product."""
    pairs = torch.stack([c.real, -c.imag], dim=-1)  # (..., H, N, 2)
    return pairs.reshape(*c.shape[:-1], 2 * c.shape[-1])


# ---------------------------------------------------------------------- one position
def diag_step(
    x: torch.Tensor,
    u: torch.Tensor,
    lam: torch.Tensor,
    cp: torch.Tensor,
    d: torch.Tensor,
    b: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, H, N) complex, u (B, H) real -> (y (B, H), x' (B, H, N)).

    lam (H, N), cp = `c_pairs(C)` (H, 2N), d (H,), b (H, N) or None when B = 1. x' is written
    into `out` when given (it must not alias x).
    """
    bsz, hdim, n = x.shape
    bu = u.unsqueeze(-1).to(x.dtype)  # (B, H, 1)
    if b is not None:
        bu = b * bu  # (B, H, N)
    xn = torch.addcmul(bu, lam, x, out=out)  # lam x + B u, one pass
    xr = torch.view_as_real(xn).reshape(bsz, hdim, 2 * n)  # (B, H, 2N), a view
    return (xr * cp).sum(-1) + d * u, xn  # Re(sum_n C x') + D u  (B, H)


def diag_step_ref(
    x: torch.Tensor, u: torch.Tensor, lam: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
    d: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The plain twin of `diag_step` (complex products written as they are in the paper)."""
    xn = lam * x + b * u.unsqueeze(-1).to(x.dtype)  # (B, H, N)
    return (c * xn).real.sum(-1) + d * u, xn


def diag_chunk_ref(
    u: torch.Tensor, x0: torch.Tensor, lam: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
    d: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Plain loop over time: u (B, T, H), x0 (B, H, N) -> (y (B, T, H), x_end (B, H, N))."""
    ys, x = [], x0
    for t in range(u.shape[1]):
        y, x = diag_step_ref(x, u[:, t], lam, b, c, d)
        ys.append(y)
    return torch.stack(ys, 1) if ys else u.new_zeros(u.shape), x


# ---------------------------------------------------------------------- a block of T positions
def chunk_tables(
    log_lam: torch.Tensor, b: torch.Tensor, c: torch.Tensor, t: int, shared: bool
) -> dict[str, torch.Tensor]:
    """The input-independent tables of a block of length t, complex128 / float64.

    log_lam, b, c (H, N) complex128 (log_lam's rows all equal when `shared`). Returns
    vout (Hs, N, t) = lam^(s+1), vin (Hs, N, t) = lam^(t-1-s), lam_t (Hs, N) = lam^t,
    kern (H, t) = K[l], with Hs = 1 when `shared` else H.
    """
    ll = log_lam[:1] if shared else log_lam  # (Hs, N)
    v = powers(ll, torch.arange(t + 1, device=log_lam.device))  # (Hs, N, t+1)
    cb = c.to(torch.complex128) * b.to(torch.complex128)  # (H, N)
    vk = v[..., :t]
    kern = (cb @ vk[0]).real if shared else (cb.unsqueeze(-1) * vk).sum(-2).real  # (H, t)
    return {"vout": v[..., 1:], "vin": v[..., :t].flip(-1), "lam_t": v[..., t], "kern": kern}


def toeplitz(kern: torch.Tensor) -> torch.Tensor:
    """Causal Toeplitz matrices of kernels (H, T) -> (H, T, T), entry [t, s] = K[t - s]."""
    idx = torch.arange(kern.shape[-1], device=kern.device)
    lag = idx.view(-1, 1) - idx.view(1, -1)  # (T, T): t - s
    return torch.where(lag >= 0, kern[:, lag.clamp(min=0)], 0)


def block_consts(
    log_lam: torch.Tensor, b: torch.Tensor, c: torch.Tensor, t: int, shared: bool,
    cdtype: torch.dtype,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """`chunk_tables` laid out for `diag_block` at state dtype `cdtype`.

    Real matrices hold complex numbers as interleaved (re, im) pairs, matching `view_as_real`
    of the state, so no op splits or joins real and imaginary parts.
    """
    h, n = c.shape
    rd = torch.float32 if cdtype == torch.complex64 else torch.float64
    tab = chunk_tables(log_lam, b, c, t, shared)
    vin_r = torch.view_as_real(tab["vin"].transpose(-1, -2).contiguous()).reshape(-1, t, 2 * n)
    consts = {
        "vin": (vin_r[0] if shared else vin_r).to(rd),  # (T, 2N) or (H, T, 2N)
        "lam_t": tab["lam_t"].expand(h, n).to(cdtype),  # lam^T (H, N)
    }
    if h * 2 * n * t * torch.finfo(rd).bits // 8 <= FOLD_BYTES:
        w = c.to(torch.complex128).unsqueeze(-1) * tab["vout"]  # (H, N, T)
        consts["wfree"] = torch.stack([w.real, -w.imag], dim=2).reshape(h, 2 * n, t).to(rd)
    else:
        vout = tab["vout"]
        vo = torch.stack([vout.real, -vout.imag], dim=-2).reshape(-1, 2 * n, t).to(rd)
        consts["vout"] = vo[0] if shared else vo  # (2N, T) or (H, 2N, T)
    if t <= TOEPLITZ_MAX:
        consts["toeplitz"] = toeplitz(tab["kern"]).to(rd)  # (H, T, T)
    else:
        consts["kf"] = torch.fft.rfft(tab["kern"].to(rd), n=2 * t)  # (H, T+1)
    return consts


def diag_block(
    u: torch.Tensor,
    x0: torch.Tensor,
    consts: dict[str, torch.Tensor],
    c: torch.Tensor,
    d: torch.Tensor,
    b: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block: u (B, T, H), x0 (B, H, N) -> (y (B, T, H), x_end (B, H, N)).

    `consts` from `block_consts` for this T; c (H, N) state dtype, d (H,), b (H, N) or None
    when B = 1. x_end is written into `out` when given (it must not alias x0).
    """
    bsz, t, h = u.shape
    n = x0.shape[-1]
    ut = u.transpose(1, 2)  # (B, H, T)
    if "toeplitz" in consts:
        conv = torch.einsum("bhs,hts->bht", ut, consts["toeplitz"])  # (B, H, T)
    else:
        conv = torch.fft.irfft(torch.fft.rfft(ut, n=2 * t) * consts["kf"], n=2 * t)[..., :t]
    # Re(sum_n C lam^(t+1) x0) as one real contraction over interleaved (re, im) pairs
    x0r = torch.view_as_real(x0).reshape(bsz, h, 2 * n)  # (B, H, 2N), a view
    if "wfree" in consts:  # C folded into the powers: (H, 2N, T)
        free = torch.einsum("bhk,hkt->bht", x0r, consts["wfree"])
    else:  # large blocks: multiply by C first, keep the powers shared
        z = torch.view_as_real(x0 * c).reshape(bsz, h, 2 * n)
        vout = consts["vout"]
        if vout.dim() == 3:
            free = torch.einsum("bhk,hkt->bht", z, vout)
        else:
            free = (z.reshape(bsz * h, 2 * n) @ vout).reshape(bsz, h, t)
    y = conv + free + d.unsqueeze(-1) * ut  # (B, H, T)
    vin = consts["vin"]
    if vin.dim() == 2:  # shared lambda: one (T, 2N) matrix for every feature
        acc = (ut.reshape(bsz * h, t) @ vin).reshape(bsz, h, n, 2)
    else:
        acc = torch.einsum("bht,htk->bhk", ut, vin).reshape(bsz, h, n, 2)
    acc_c = torch.view_as_complex(acc.contiguous())  # sum_s lam^(T-1-s) u_s  (B, H, N)
    if b is not None:
        acc_c = b * acc_c
    x_end = torch.addcmul(acc_c, consts["lam_t"], x0, out=out)  # lam^T x0 + acc, one pass
    return y.transpose(1, 2), x_end
