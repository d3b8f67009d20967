"""Pure-torch reference: the network as a plain loop over time, float64 by default.

This is the specification every fast path (FFT convolution, chunk form, batched step, ONNX
graphs) is tested against. It is deliberately naive: one position at a time, one layer at a
time, x_t = lam * x_{t-1} + B u_t with lam = exp(log_lam) formed once in complex128.
"""

from __future__ import annotations

import copy

import torch

from .feature_norm import norm_decay
from .frontend import LOG_EPS, LOG_SCALE, LOG_SHIFT
from .heads import pool_decay
from .model import DLRModel
from .pcen import PCEN_EPS, pcen_decay


@torch.no_grad()
def reference_forward(
    model: DLRModel, x: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Input (B, L) -> outputs (B, L', out_dim), exactly what `model(x)` computes.

    For audio, a frame is encoded when its last sample arrives (L' = L // frame_stride). The
    PCEN smoother, the feature normalisation and the classifier's pooling run as plain loops of
    their recurrences.
    """
    cfg = model.config
    m = copy.deepcopy(model).to(dtype).eval()
    cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    params = [blk.ssm.recurrent_params() for blk in m.blocks]
    lam = [torch.exp(p.log_lam.to(torch.complex128)).to(cdtype) for p in params]
    bvec = [p.B.to(cdtype) for p in params]
    cvec = [p.C.to(cdtype) for p in params]
    dvec = [p.D.to(dtype) for p in params]

    if cfg.encoder == "tokens":
        feats = m.encoder.embed(x)  # (B, L, H)
    else:
        stride, hist = cfg.frame_stride, cfg.history
        n = x.shape[1] // stride
        xs = torch.cat([x.new_zeros(x.shape[0], hist), x[:, : n * stride]], dim=1).to(dtype)
        windows = xs.new_zeros(x.shape[0], n, hist + stride)  # frame t: its window, as a loop
        for t in range(n):
            windows[:, t] = xs[:, t * stride : t * stride + hist + stride]
        feats = m.encoder.frontend(windows)  # (B, n, F)
        p = pcen_decay(cfg)
        if p:  # PCEN: each energy over a power of its decayed mean so far, as a loop
            pc = m.encoder.pcen
            alpha, delta, r = pc.log_alpha.exp(), pc.log_delta.exp(), pc.log_r.exp()
            e_sum, e_cnt, comp = torch.zeros_like(feats[:, 0]), 0.0, []
            for t in range(n):
                e_sum, e_cnt = p * e_sum + feats[:, t], p * e_cnt + 1.0
                smooth = e_sum / e_cnt
                g = feats[:, t] / (PCEN_EPS + smooth) ** alpha
                pc_t = (g + delta) ** r - delta**r
                if cfg.frontend == "logmel_pcen":  # the log-mel features first
                    log_t = (torch.log(feats[:, t] + LOG_EPS) + LOG_SHIFT) / LOG_SCALE
                    pc_t = torch.cat([log_t, pc_t], dim=-1)
                comp.append(pc_t)
            feats = (
                torch.stack(comp, dim=1)
                if comp
                else feats.new_zeros(*feats.shape[:2], cfg.feature_dim)
            )
        a = norm_decay(cfg)
        if a:  # feature normalisation: minus the decayed mean so far, as a loop
            f_sum, f_cnt, normed = torch.zeros_like(feats[:, 0]), 0.0, []
            for t in range(n):
                f_sum, f_cnt = a * f_sum + feats[:, t], a * f_cnt + 1.0
                normed.append(feats[:, t] - f_sum / f_cnt)
            feats = torch.stack(normed, dim=1) if normed else feats
        feats = m.encoder.frame(feats)

    bsz, length, h = feats.shape
    state = [torch.zeros(bsz, h, cfg.d_state, dtype=cdtype) for _ in params]
    mean_sum = torch.zeros(bsz, h, dtype=dtype)
    decay = pool_decay(cfg) if cfg.decoder == "classifier" else 1.0
    count = 0.0
    outs = []
    for t in range(length):
        hid = feats[:, t]  # (B, H)
        for i, blk in enumerate(m.blocks):
            u = blk.pw.pre(hid)
            state[i] = lam[i] * state[i] + bvec[i] * u.unsqueeze(-1)  # (B, H, N)
            s = (cvec[i] * state[i]).real.sum(-1) + dvec[i] * u
            hid = blk.pw.post(hid, s)
        f = m.head.features(hid)
        if cfg.decoder == "classifier":
            mean_sum, count = decay * mean_sum + f, decay * count + 1.0
            f = mean_sum / count
        outs.append(_project(m.head.proj, f, cfg.unknown_classes))
    return torch.stack(outs, dim=1)


def _project(proj: torch.nn.Linear, f: torch.Tensor, union: int) -> torch.Tensor:
    """Features (B, H) -> scores (B, C); with a union head, the last label's score is the log
    of the summed exponentials of its classes' logits, as a loop (unknown_head.py)."""
    logits = f @ proj.weight.T + proj.bias  # (B, C - 1 + union), or (B, C)
    if not union:
        return logits
    first = logits.shape[-1] - union
    top = logits[:, first:].max(-1).values  # (B,) the sum is taken around its largest term
    total = torch.zeros_like(top)
    for k in range(union):
        total = total + torch.exp(logits[:, first + k] - top)
    return torch.cat([logits[:, :first], (top + torch.log(total)).unsqueeze(-1)], dim=-1)
