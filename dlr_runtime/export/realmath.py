"""Real-arithmetic twin of `RecurrentModel`'s step and chunk, for export to ONNX.

ONNX Runtime has no complex tensors, so the complex state x in C^{B x L x H x N} is carried as
two real tensors (state_re, state_im) and every complex product is written out:

    x'  = lam * x + B u          ->  x'_re = lam_re x_re - lam_im x_im + B_re u
                                      x'_im = lam_re x_im + lam_im x_re + B_im u
    y   = Re(sum_n C x') + D u   ->  y = sum_n (C_re x'_re - C_im x'_im) + D u

The chunk form is the one of `recurrent.py` (Toeplitz convolution + two Vandermonde matmuls),
with tables precomputed once in complex128 for the largest block `max_chunk` and sliced to the
block length T inside the graph, so one exported graph serves every T in [1, max_chunk]:

    Toeplitz_T = Toeplitz_max[:, :T, :T]       (the kernel depends on the lag t - s only)
    vout_T     = vout_max[..., :T]             (lam^(t+1), t < T)
    vin_T      = vin_max[max_chunk - T:]       (lam^(T-1-s), s < T)
    lam^T      = vout_max[..., T - 1]

`RealCore` holds the weights; `LMStep`, `LMChunk`, `ClassifierStep`, `ClassifierChunk`,
`ClassifierScores` (and `NormClassifierStep` / `NormClassifierChunk` for audio models with
feature normalisation, which add its two state tensors) are the small modules that get exported
(real tensors in and out). Audio
graphs take whole frames' windows (B, W) / (B, T, W); the sample-level framing (frame buffer,
fill count, history) stays on the torch side (`dlr_runtime.backends.onnx`), exactly as
`RecurrentModel` does it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DLRConfig
from ..diagonal import chunk_tables, toeplitz
from ..feature_norm import normalise_step
from ..heads import pool_block_tables, pool_step
from ..recurrent import RecurrentModel

FLOAT_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def unexportable(cfg: DLRConfig) -> str | None:
    """Why `cfg`'s network has no exported graph (ONNX or Triton's); None: it has."""
    if cfg.frontend == "speech_embedding":
        return (
            "the speech-embedding front end streams from its convolutions' cached rows, which "
            "no exported graph carries; serve it with the torch or fused backend"
        )
    if not cfg.has_pcen:
        return None
    if cfg.feature_norm_s:
        return (
            "the PCEN front end together with feature normalisation has no exported graph; "
            "serve it with the torch or fused backend"
        )
    return None


class RealCore(nn.Module):
    """The stack of a `RecurrentModel` in real arithmetic, at float dtype `dtype`."""

    def __init__(
        self, rec: RecurrentModel, dtype: torch.dtype = torch.float32, max_chunk: int = 64
    ) -> None:
        super().__init__()
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"RealCore dtype must be float32 or float64, got {dtype}")
        if not 1 <= max_chunk <= 1024:
            raise ValueError(f"max_chunk must be in [1, 1024], got {max_chunk}")
        self.config = rec.config
        self.dtype = dtype
        self.max_chunk = max_chunk
        self.f32_erf = dtype == torch.float64  # see `_post`; torch-only users may turn it off
        self.shared = list(rec.shared)
        cpu = torch.device("cpu")
        self.encoder = copy.deepcopy(rec.encoder).to(cpu, dtype).eval()
        self.blocks = nn.ModuleList(copy.deepcopy(b).to(cpu, dtype).eval() for b in rec.blocks)
        self.head = copy.deepcopy(rec.head).to(cpu, dtype).eval()
        log_lam = rec.log_lam.detach().to(cpu, torch.complex128)  # (L, H, N)
        lam = torch.exp(log_lam).to(rec.cdtype).to(torch.complex128)  # the step's own rounding
        b = rec.B.detach().to(cpu, torch.complex128)  # (L, H, N)
        c = rec.C.detach().to(cpu, torch.complex128)  # (L, H, N)
        self.register_buffer("lam_re", lam.real.to(dtype))
        self.register_buffer("lam_im", lam.imag.to(dtype))
        self.b_is_one = [bool((b[i] == 1).all()) for i in range(b.shape[0])]  # DLR layers: B = 1
        self.register_buffer("B_re", b.real.to(dtype))
        self.register_buffer("B_im", b.imag.to(dtype))
        self.register_buffer("C_re", c.real.to(dtype))
        self.register_buffer("C_im", c.imag.to(dtype))
        self.register_buffer("D", rec.D.detach().to(cpu, dtype))  # (L, H)
        toe, vout, vin = [], [], []
        for i in range(log_lam.shape[0]):
            t_, o_, n_ = _chunk_tables(log_lam[i], b[i], c[i], max_chunk, self.shared[i])
            toe.append(t_)
            vout.append(o_)
            vin.append(n_)
        self.register_buffer("toeplitz", torch.stack(toe).to(dtype))  # (L, H, Tm, Tm)
        self.register_buffer("vout", torch.stack(vout).to(dtype))  # (L, Hs, 2N, Tm)
        self.register_buffer("vin", torch.stack(vin).to(dtype))  # (L, Hs, Tm, 2N)
        # exponential-window head (dlr_runtime/heads.py): a^(t-s) and a^(t+1) tables, float64
        w, carry = pool_block_tables(self.head.decay, max_chunk)
        self.register_buffer("pool_w", w)  # (Tm, Tm)
        self.register_buffer("pool_carry", carry)  # (Tm,)
        self.norm_decay = self.encoder.norm_decay if self.config.encoder == "audio" else 0.0
        # feature normalisation (dlr_runtime/feature_norm.py): the same tables for its decay
        w, carry = pool_block_tables(self.norm_decay or 1.0, max_chunk)
        self.register_buffer("norm_w", w)  # (Tm, Tm)
        self.register_buffer("norm_carry", carry)  # (Tm,)
        # PCEN (dlr_runtime/pcen.py): the tables of its smoother's decay
        self.pcen = self.encoder.pcen if self.config.encoder == "audio" else None
        w, carry = pool_block_tables(self.pcen.decay if self.pcen is not None else 1.0, max_chunk)
        self.register_buffer("pcen_w", w)  # (Tm, Tm)
        self.register_buffer("pcen_carry", carry)  # (Tm,)
        self.requires_grad_(False)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (...,) int64 or full audio frames (..., S) of a front end without state
        -> (..., H)."""
        if self.config.encoder == "tokens":
            return self.encoder.embed(x)
        return self.encoder.encode_frames(x)

    def encode_norm(
        self, x: torch.Tensor, feat_sum: torch.Tensor, feat_count: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Audio frames (B, W) or (B, T, W) through a front end with a state: PCEN's smoother
        or the feature normalisation, its sums (B, F) f64 and counts (B,) f64 -> (h (B, [T,] H),
        new sums, new counts)."""
        f = self.encoder.frontend(x)  # (B, [T,] F)
        if self.pcen is not None:
            if f.dim() == 2:
                g, fs, fc = self.pcen.step(f, feat_sum, feat_count)
                return self.encoder.frame(g), fs, fc
            sums, counts = _decayed_sums(f, feat_sum, feat_count, self.pcen_w, self.pcen_carry)
            g = self.pcen.compress(f.to(torch.float64), sums / counts.unsqueeze(-1))
            return self.encoder.frame(g.to(self.dtype)), sums[:, -1], counts[:, -1]
        if f.dim() == 2:
            g, fs, fc = normalise_step(f, feat_sum, feat_count, self.norm_decay)
            return self.encoder.frame(g), fs, fc
        sums, counts = _decayed_sums(f, feat_sum, feat_count, self.norm_w, self.norm_carry)
        g = (f.to(torch.float64) - sums / counts.unsqueeze(-1)).to(self.dtype)  # (B, T, F)
        return self.encoder.frame(g), sums[:, -1], counts[:, -1]

    def _post(self, pw: nn.Module, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """`BlockPointwise.post` (eval mode) with a GELU ONNX Runtime runs in float64 too.

        ONNX Runtime has no float64 Erf kernel, so a float64 graph evaluates erf in float32
        (relative error ~1e-7 in the activation; the state recurrence stays float64).
        """
        if self.f32_erf:
            z = 0.5 * s * (1.0 + torch.erf(s.float() * 0.7071067811865476).double())
        else:
            z = F.gelu(s)
        z = pw.out(z)
        if pw.glu:
            z = F.glu(z, dim=-1)
        h = h + z
        return h if pw.prenorm else pw.norm(h)

    # ------------------------------------------------------------------ one position
    def core_step(
        self, h: torch.Tensor, s_re: torch.Tensor, s_im: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h (B, H), state (B, L, H, N) x 2 -> head features (B, H), new state x 2."""
        res, ims = [], []
        for i, pw in enumerate(self.blocks):
            u = pw.pre(h).unsqueeze(-1)  # (B, H, 1)
            xr, xi = s_re[:, i], s_im[:, i]  # (B, H, N)
            if self.b_is_one[i]:  # B = 1: fewer passes over the state (the step is memory-bound)
                nr = self.lam_re[i] * xr - self.lam_im[i] * xi + u  # (B, H, N)
                ni = self.lam_re[i] * xi + self.lam_im[i] * xr  # (B, H, N)
            else:
                nr = self.lam_re[i] * xr - self.lam_im[i] * xi + self.B_re[i] * u  # (B, H, N)
                ni = self.lam_re[i] * xi + self.lam_im[i] * xr + self.B_im[i] * u  # (B, H, N)
            s = (self.C_re[i] * nr - self.C_im[i] * ni).sum(-1) + self.D[i] * u.squeeze(-1)
            h = self._post(pw, h, s)  # (B, H)
            res.append(nr)
            ims.append(ni)
        return self.head.features(h), torch.stack(res, 1), torch.stack(ims, 1)

    # ------------------------------------------------------------------ a block of T positions
    def core_chunk(
        self, h: torch.Tensor, s_re: torch.Tensor, s_im: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h (B, T, H) with 1 <= T <= max_chunk -> features (B, T, H), new state x 2."""
        t = h.shape[1]
        n = self.config.d_state
        tm = self.max_chunk
        res, ims = [], []
        for i, pw in enumerate(self.blocks):
            ut = pw.pre(h).transpose(1, 2)  # (B, H, T)
            xr, xi = s_re[:, i], s_im[:, i]  # (B, H, N)
            conv = torch.einsum("bhs,hts->bht", ut, self.toeplitz[i][:, :t, :t])  # (B, H, T)
            zr = xr * self.C_re[i] - xi * self.C_im[i]  # Re(x C)  (B, H, N)
            zi = xr * self.C_im[i] + xi * self.C_re[i]  # Im(x C)  (B, H, N)
            zz = torch.cat([zr, -zi], dim=-1)  # (B, H, 2N)
            vout = self.vout[i][..., :t]  # (Hs, 2N, T)
            vin = self.vin[i][:, tm - t :]  # (Hs, T, 2N)
            if self.shared[i]:
                free = torch.matmul(zz, vout[0])  # (B, H, T)
                acc = torch.matmul(ut, vin[0])  # (B, H, 2N)
            else:
                free = torch.einsum("bhk,hkt->bht", zz, vout)
                acc = torch.einsum("bht,htk->bhk", ut, vin)
            y = conv + free + self.D[i].unsqueeze(-1) * ut  # (B, H, T)
            lt = self.vout[i][..., t - 1]  # lam^T  (Hs, 2N)
            lr, li = lt[..., :n], lt[..., n:]  # (Hs, N)
            ar, ai = acc[..., :n], acc[..., n:]  # sum_s lam^(T-1-s) u_s  (B, H, N)
            if self.b_is_one[i]:
                nr = lr * xr - li * xi + ar  # (B, H, N)
                ni = lr * xi + li * xr + ai  # (B, H, N)
            else:
                nr = lr * xr - li * xi + self.B_re[i] * ar - self.B_im[i] * ai  # (B, H, N)
                ni = lr * xi + li * xr + self.B_re[i] * ai + self.B_im[i] * ar  # (B, H, N)
            h = self._post(pw, h, y.transpose(1, 2))  # (B, T, H)
            res.append(nr)
            ims.append(ni)
        return self.head.features(h), torch.stack(res, 1), torch.stack(ims, 1)

    # ------------------------------------------------------------------ classifier head
    def running_scores(
        self, f: torch.Tensor, mean_sum: torch.Tensor, mean_count: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features f (B, T, H) -> scores (B, T, C), new mean_sum (B, H), mean_count (B,)."""
        if self.head.decay != 1.0:  # exponential window
            sums, counts = _decayed_sums(f, mean_sum, mean_count, self.pool_w, self.pool_carry)
        else:
            sums = mean_sum.unsqueeze(1) + torch.cumsum(f.to(torch.float64), dim=1)  # (B, T, H)
            steps = torch.cumsum(torch.ones_like(f[0, :, 0], dtype=torch.float64), dim=0)  # (T,)
            counts = mean_count.unsqueeze(1) + steps  # (B, T)
        scores = self.head.proj((sums / counts.unsqueeze(-1)).to(self.dtype))  # (B, T, C)
        return scores, sums[:, -1], counts[:, -1]

    def scores(self, mean_sum: torch.Tensor, mean_count: torch.Tensor) -> torch.Tensor:
        mean = mean_sum / mean_count.clamp(min=1).unsqueeze(-1)  # (B, H) float64
        return self.head.proj(mean.to(self.dtype))  # (B, C)


def _decayed_sums(
    f: torch.Tensor, s0: torch.Tensor, c0: torch.Tensor, w: torch.Tensor, carry: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`heads.pool_block` with precomputed tables w (Tm, Tm), carry (Tm,) sliced to T:
    f (B, T, D), s0 (B, D), c0 (B,) -> sums (B, T, D), counts (B, T), float64;
    S_t = a^(t+1) S0 + sum_{s<=t} a^(t-s) f_s."""
    t = f.shape[1]
    w, carry = w[:t, :t], carry[:t]  # (T, T), (T,)
    sums = torch.einsum("ts,bsd->btd", w, f.to(torch.float64)) + carry.view(
        1, -1, 1
    ) * s0.unsqueeze(1)
    counts = w.sum(-1).unsqueeze(0) + carry.unsqueeze(0) * c0.unsqueeze(1)
    return sums, counts


def _chunk_tables(
    log_lam: torch.Tensor, b: torch.Tensor, c: torch.Tensor, tm: int, shared: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`diagonal.chunk_tables` laid out for the graphs: Toeplitz (H, Tm, Tm), vout (Hs, 2N, Tm)
    as (re; im) halves, vin (Hs, Tm, 2N); complex128 in, float64 out."""
    tab = chunk_tables(log_lam, b, c, tm, shared)
    vout, vin = tab["vout"], tab["vin"]  # lam^(t+1), lam^(Tm-1-s): (Hs, N, Tm)
    vout_r = torch.cat([vout.real, vout.imag], dim=-2)  # (Hs, 2N, Tm)
    vin_r = torch.cat([vin.real, vin.imag], dim=-2).transpose(-1, -2)  # (Hs, Tm, 2N)
    return toeplitz(tab["kern"]), vout_r, vin_r


# ---------------------------------------------------------------------- exported modules
class LMStep(nn.Module):
    """x (B,) tokens, state_re, state_im (B, L, H, N) -> logits (B, V), new state x 2."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, x: torch.Tensor, state_re: torch.Tensor, state_im: torch.Tensor):
        f, nr, ni = self.core.core_step(self.core.encode(x), state_re, state_im)
        return self.core.head.proj(f), nr, ni


class LMChunk(nn.Module):
    """x (B, T) tokens, state x 2 -> logits (B, T, V), new state x 2."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, x: torch.Tensor, state_re: torch.Tensor, state_im: torch.Tensor):
        f, nr, ni = self.core.core_chunk(self.core.encode(x), state_re, state_im)
        return self.core.head.proj(f), nr, ni


class ClassifierStep(nn.Module):
    """One position per stream (a token (B,) or a full audio frame (B, S)), state x 2,
    mean_sum (B, H) f64, mean_count (B,) f64 -> scores (B, C), the four new state tensors."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, x, state_re, state_im, mean_sum, mean_count):
        f, nr, ni = self.core.core_step(self.core.encode(x), state_re, state_im)  # f (B, H)
        ms, mc = pool_step(mean_sum, mean_count, f.to(torch.float64), self.core.head.decay)
        return self.core.scores(ms, mc), nr, ni, ms, mc


class ClassifierChunk(nn.Module):
    """T positions per stream (tokens (B, T) or frames (B, T, S)), state... -> scores
    (B, T, C), the four new state tensors."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, x, state_re, state_im, mean_sum, mean_count):
        f, nr, ni = self.core.core_chunk(self.core.encode(x), state_re, state_im)  # (B, T, H)
        scores, ms, mc = self.core.running_scores(f, mean_sum, mean_count)
        return scores, nr, ni, ms, mc


class NormClassifierStep(nn.Module):
    """`ClassifierStep` of an audio model with feature normalisation: the same inputs, then
    feat_sum (B, F) f64, feat_count (B,) f64 -> the same outputs, then the two new ones."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, x, state_re, state_im, mean_sum, mean_count, feat_sum, feat_count):
        h, fs, fc = self.core.encode_norm(x, feat_sum, feat_count)  # h (B, H)
        f, nr, ni = self.core.core_step(h, state_re, state_im)
        ms, mc = pool_step(mean_sum, mean_count, f.to(torch.float64), self.core.head.decay)
        return self.core.scores(ms, mc), nr, ni, ms, mc, fs, fc


class NormClassifierChunk(nn.Module):
    """`ClassifierChunk` with feature normalisation (inputs and outputs as `NormClassifierStep`)."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, x, state_re, state_im, mean_sum, mean_count, feat_sum, feat_count):
        h, fs, fc = self.core.encode_norm(x, feat_sum, feat_count)  # h (B, T, H)
        f, nr, ni = self.core.core_chunk(h, state_re, state_im)
        scores, ms, mc = self.core.running_scores(f, mean_sum, mean_count)
        return scores, nr, ni, ms, mc, fs, fc


class ClassifierScores(nn.Module):
    """mean_sum (B, H) f64, mean_count (B,) f64 -> class scores (B, C) of the running mean."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, mean_sum: torch.Tensor, mean_count: torch.Tensor) -> torch.Tensor:
        return self.core.scores(mean_sum, mean_count)
