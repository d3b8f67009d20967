"""The fused CPU decode step of a token LM: the whole network for one token in one call.

`RecurrentModel.step` is ~40 small torch ops per layer; at batch 1 the time is per-op dispatch,
not arithmetic (~0.7-1 ms per token for the shipped byte LM). `fused_step` does the same
arithmetic in one numba-compiled loop per session row:

    h = embed[token]
    per layer: u = norm(h) (prenorm) ; x' = lam x + B u ; s = Re(sum_n C x') + D u
               z = W_out gelu(s) + b_out ; h = h + glu(z) (or + z) ; [h = norm(h) postnorm]
    logits = W_head norm_f(h) + b_head

The state is read once and written once (the step is memory-bound at large batch). Each row is
computed alone, in the same order whatever the batch, so batching never changes a session's
output (bit for bit). The state is kept as two real planes (re, im) (B, L, H, N), the layout
of `state_spec.split_complex`, and complex weights as (re, im) planes too, so the inner loop
runs over contiguous real arrays and vectorises.

`fused_step_ref` is the plain-torch twin with the same signature (tests compare the two per
dtype: float64 to 1e-10, float32 to 1e-5). numba is optional: `AVAILABLE` says whether the
kernel can run; it is compiled on first use (a few seconds) and cached on disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..recurrent import RecurrentModel

try:  # optional: without numba the "fused" backend falls back to the torch step
    import numba

    AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the install
    numba = None
    AVAILABLE = False

NORM_NONE, NORM_LAYER, NORM_RMS = 0, 1, 2


@dataclass
class FusedWeights:
    """Every weight of a token LM's step as contiguous real tensors of one float dtype."""

    emb: torch.Tensor  # (V, H)
    norm_kind: int  # NORM_* of the blocks' norm (the head's is `head_kind`)
    norm_w: torch.Tensor  # (L, H) (ones when absent)
    norm_b: torch.Tensor  # (L, H) (zeros when absent or RMSNorm)
    eps: float
    lam: torch.Tensor  # (L, H, N) complex
    bvec: torch.Tensor  # (L, H, N) complex
    b_is_one: torch.Tensor  # (L,) bool: B = 1 (DLR layers), skip the product
    cvec: torch.Tensor  # (L, H, N) complex
    dvec: torch.Tensor  # (L, H)
    out_w: torch.Tensor  # (L, O, H), O = 2H with GLU else H
    out_b: torch.Tensor  # (L, O)
    glu: bool
    prenorm: bool
    head_kind: int
    head_w: torch.Tensor  # (H,)
    head_b: torch.Tensor  # (H,)
    head_eps: float
    proj_w: torch.Tensor  # (V, H)
    proj_b: torch.Tensor  # (V,)


def _norm_parts(
    norm: nn.Module, h: int, dtype: torch.dtype
) -> tuple[int, torch.Tensor, torch.Tensor, float]:
    ones, zeros = torch.ones(h, dtype=dtype), torch.zeros(h, dtype=dtype)
    if isinstance(norm, nn.LayerNorm):
        w = ones if norm.weight is None else norm.weight.detach().to(dtype)
        b = zeros if norm.bias is None else norm.bias.detach().to(dtype)
        return NORM_LAYER, w, b, float(norm.eps)
    if isinstance(norm, nn.RMSNorm):
        w = ones if norm.weight is None else norm.weight.detach().to(dtype)
        eps = torch.finfo(dtype).eps if norm.eps is None else float(norm.eps)
        return NORM_RMS, w, zeros, eps
    if isinstance(norm, nn.Identity):
        return NORM_NONE, ones, zeros, 0.0
    raise TypeError(f"the fused step has no kernel for norm {type(norm).__name__}")


def pack(rec: RecurrentModel) -> FusedWeights:
    """The weights of a token LM `rec` at its float dtype, on the CPU."""
    cfg = rec.config
    if cfg.encoder != "tokens" or cfg.decoder != "lm":
        raise ValueError("the fused step is for token language models")
    dt, h = rec.rdtype, cfg.d_model
    cpu = lambda t: t.detach().to("cpu").contiguous()  # noqa: E731
    kinds, ws, bs, eps = zip(*(_norm_parts(pw.norm, h, dt) for pw in rec.blocks), strict=True)
    hk, hw, hb, heps = _norm_parts(rec.head.norm, h, dt)
    return FusedWeights(
        emb=cpu(rec.encoder.embed.weight.to(dt)),
        norm_kind=kinds[0],
        norm_w=cpu(torch.stack(ws)),
        norm_b=cpu(torch.stack(bs)),
        eps=eps[0],
        lam=cpu(rec.lam),
        bvec=cpu(rec.B),
        b_is_one=torch.tensor(rec.b_is_one, dtype=torch.bool),
        cvec=cpu(rec.C),
        dvec=cpu(rec.D),
        out_w=cpu(torch.stack([pw.out.weight for pw in rec.blocks])),
        out_b=cpu(torch.stack([pw.out.bias for pw in rec.blocks])),
        glu=bool(rec.blocks[0].glu),
        prenorm=bool(rec.blocks[0].prenorm),
        head_kind=hk,
        head_w=cpu(hw),
        head_b=cpu(hb),
        head_eps=heps,
        proj_w=cpu(rec.head.proj.weight),
        proj_b=cpu(rec.head.proj.bias),
    )


# ---------------------------------------------------------------------- the plain twin
def _norm_ref(x: torch.Tensor, kind: int, w: torch.Tensor, b: torch.Tensor, eps: float):
    if kind == NORM_LAYER:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * w + b
    if kind == NORM_RMS:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w
    return x


def fused_step_ref(
    w: FusedWeights, tokens: torch.Tensor, s_re: torch.Tensor, s_im: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens (B,), state planes s_re, s_im (B, L, H, N) -> logits (B, V), new planes x 2."""
    h = w.emb[tokens]  # (B, H)
    lam, bvec, cvec = w.lam, w.bvec, w.cvec  # (L, H, N) complex
    x = torch.complex(s_re, s_im)  # (B, L, H, N)
    new = []
    for i in range(lam.shape[0]):
        u = _norm_ref(h, w.norm_kind, w.norm_w[i], w.norm_b[i], w.eps) if w.prenorm else h
        xn = lam[i] * x[:, i] + bvec[i] * u.unsqueeze(-1)  # (B, H, N)
        s = (cvec[i] * xn).real.sum(-1) + w.dvec[i] * u  # (B, H)
        z = F.gelu(s) @ w.out_w[i].T + w.out_b[i]  # (B, O)
        h = h + (F.glu(z, dim=-1) if w.glu else z)
        if not w.prenorm:
            h = _norm_ref(h, w.norm_kind, w.norm_w[i], w.norm_b[i], w.eps)
        new.append(xn)
    f = _norm_ref(h, w.head_kind, w.head_w, w.head_b, w.head_eps)
    xn = torch.stack(new, 1)  # (B, L, H, N)
    return f @ w.proj_w.T + w.proj_b, xn.real.contiguous(), xn.imag.contiguous()


# ---------------------------------------------------------------------- the kernel
if AVAILABLE:
    _jit = numba.njit(cache=True, fastmath=True, nogil=True)

    @_jit
    def _norm(x, out, kind, w, b, eps):  # pragma: no cover - compiled
        n = x.shape[0]
        if kind == NORM_LAYER:
            mean = x.sum() / n
            var = ((x - mean) ** 2).sum() / n
            inv = 1.0 / math.sqrt(var + eps)
            for k in range(n):
                out[k] = (x[k] - mean) * inv * w[k] + b[k]
        elif kind == NORM_RMS:
            inv = 1.0 / math.sqrt((x * x).sum() / n + eps)
            for k in range(n):
                out[k] = x[k] * inv * w[k]
        else:
            out[:] = x

    @_jit
    def _gemm_rows(wt, bias, x, out):  # pragma: no cover - compiled
        """out[r] = wt @ x[r] + bias for every row r; one weight row serves all rows while it
        is in cache, and every row's dot product runs in the same order whatever the batch."""
        for o in range(wt.shape[0]):
            for r in range(x.shape[0]):
                acc = bias[o]
                for k in range(wt.shape[1]):
                    acc += wt[o, k] * x[r, k]
                out[r, o] = acc

    @_jit
    def _ssm_rows(
        u, xr_in, xi_in, xr_out, xi_out, i, lam, bvec, b_is_one, cvec, dvec, s
    ):  # pragma: no cover
        """Layer i for every row: x' = lam x + B u, s = gelu(Re(sum_n C x') + D u).

        u (B, H); state planes xr_*, xi_* (B, L, H, N); lam, bvec, cvec (2, L, H, N) as
        (re, im) planes; s (B, H) out. Planar, C-contiguous arrays: the inner loop vectorises.
        """
        hdim, n = lam.shape[2], lam.shape[3]
        inv_sqrt2 = 1.0 / math.sqrt(2.0)
        for r in range(u.shape[0]):  # full indices, no sub-array views: views cost refcounts
            for k in range(hdim):
                uk = u[r, k]
                acc = dvec[i, k] * uk
                if b_is_one[i]:
                    for m in range(n):
                        xr, xi = xr_in[r, i, k, m], xi_in[r, i, k, m]
                        lr, li = lam[0, i, k, m], lam[1, i, k, m]
                        nr = lr * xr - li * xi + uk
                        ni = lr * xi + li * xr
                        xr_out[r, i, k, m] = nr
                        xi_out[r, i, k, m] = ni
                        acc += cvec[0, i, k, m] * nr - cvec[1, i, k, m] * ni
                else:
                    for m in range(n):
                        xr, xi = xr_in[r, i, k, m], xi_in[r, i, k, m]
                        lr, li = lam[0, i, k, m], lam[1, i, k, m]
                        nr = lr * xr - li * xi + bvec[0, i, k, m] * uk
                        ni = lr * xi + li * xr + bvec[1, i, k, m] * uk
                        xr_out[r, i, k, m] = nr
                        xi_out[r, i, k, m] = ni
                        acc += cvec[0, i, k, m] * nr - cvec[1, i, k, m] * ni
                s[r, k] = 0.5 * acc * (1.0 + math.erf(acc * inv_sqrt2))  # exact GELU

    @_jit
    def _decode(  # pragma: no cover - compiled
        tokens, emb, norm_kind, norm_w, norm_b, eps, lam, bvec, b_is_one, cvec, dvec,
        out_w, out_b, glu, prenorm, head_kind, head_w, head_b, head_eps, proj_w, proj_b,
        xr_in, xi_in, xr_out, xi_out, y,
    ):  # fmt: skip
        n_layers, hdim = lam.shape[1], lam.shape[2]
        bsz = tokens.shape[0]
        h = np.empty((bsz, hdim), emb.dtype)
        u = np.empty((bsz, hdim), emb.dtype)
        s = np.empty((bsz, hdim), emb.dtype)
        z = np.empty((bsz, out_w.shape[1]), emb.dtype)
        for r in range(bsz):
            h[r] = emb[tokens[r]]
        for i in range(n_layers):
            for r in range(bsz):
                if prenorm:
                    _norm(h[r], u[r], norm_kind, norm_w[i], norm_b[i], eps)
                else:
                    u[r] = h[r]
            _ssm_rows(u, xr_in, xi_in, xr_out, xi_out, i, lam, bvec, b_is_one, cvec, dvec, s)
            _gemm_rows(out_w[i], out_b[i], s, z)
            for r in range(bsz):
                if glu:
                    for k in range(hdim):
                        h[r, k] += z[r, k] / (1.0 + math.exp(-z[r, k + hdim]))
                else:
                    for k in range(hdim):
                        h[r, k] += z[r, k]
                if not prenorm:
                    _norm(h[r].copy(), h[r], norm_kind, norm_w[i], norm_b[i], eps)
        for r in range(bsz):
            _norm(h[r], u[r], head_kind, head_w, head_b, head_eps)
        _gemm_rows(proj_w, proj_b, u, y)


def _planes(t: torch.Tensor) -> np.ndarray:
    """Complex (...) -> (2, ...) real (re, im) planes, C-contiguous numpy."""
    return torch.stack([t.real, t.imag]).contiguous().numpy()


def kernel_args(w: FusedWeights) -> tuple:
    """The weights as the kernel's positional arguments (numpy arrays, made once per model)."""
    return (
        w.emb.numpy(), w.norm_kind, w.norm_w.numpy(), w.norm_b.numpy(), w.eps, _planes(w.lam),
        _planes(w.bvec), w.b_is_one.numpy(), _planes(w.cvec), w.dvec.numpy(), w.out_w.numpy(),
        w.out_b.numpy(), w.glu, w.prenorm, w.head_kind, w.head_w.numpy(), w.head_b.numpy(),
        w.head_eps, w.proj_w.numpy(), w.proj_b.numpy(),
    )  # fmt: skip


def fused_step(
    w: FusedWeights,
    tokens: torch.Tensor,
    s_re: torch.Tensor,
    s_im: torch.Tensor,
    args: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused_step_ref` in one compiled call (CPU tensors; needs numba, see `AVAILABLE`).

    `args` = `kernel_args(w)`, when the caller keeps it, saves re-making the arrays.
    """
    if not AVAILABLE:
        raise RuntimeError("the fused step needs numba (pip install numba)")
    tok = tokens.numpy() if tokens.dtype == torch.int64 else tokens.to(torch.int64).numpy()
    xr, xi = s_re.contiguous().numpy(), s_im.contiguous().numpy()  # (B, L, H, N)
    nr, ni = np.empty_like(xr), np.empty_like(xi)
    y = np.empty((tok.shape[0], w.proj_w.shape[0]), dtype=xr.dtype)
    _decode(tok, *(kernel_args(w) if args is None else args), xr, xi, nr, ni, y)
    return torch.from_numpy(y), torch.from_numpy(nr), torch.from_numpy(ni)
