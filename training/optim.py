"""Optimiser and schedule: AdamW with a separate group for the SSM parameters, warmup + cosine.

As in the paper's code, the parameters of the diagonal layers (lambda and W for DLR; their
counterparts for S4D/LRU, i.e. everything under `blocks[i].ssm`) get their own learning rate and
no weight decay. Outside them, matrices are decayed and biases, norms and embeddings are not.
The schedule is a pure function of the step, so resuming needs only the step number.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import TrainConfig


def is_ssm_param(name: str) -> bool:
    """True for parameters of a diagonal SSM layer (`blocks.<i>.ssm.*`), under any prefix."""
    return ".ssm." in f".{name}"


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """Three AdamW groups: SSM (own lr and decay), decayed matrices, undecayed rest."""
    ssm, decay, no_decay = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if is_ssm_param(name):
            ssm.append(p)
        elif p.dim() >= 2 and "embed" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [
        {"params": ssm, "lr": cfg.ssm_lr, "weight_decay": cfg.ssm_weight_decay, "name": "ssm"},
        {"params": decay, "lr": cfg.lr, "weight_decay": cfg.weight_decay, "name": "decay"},
        {"params": no_decay, "lr": cfg.lr, "weight_decay": 0.0, "name": "no_decay"},
    ]
    for g in groups:
        g["peak_lr"] = g["lr"]
    return [g for g in groups if g["params"]]


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, cfg), betas=cfg.betas)


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at `step` (0-based): linear warmup, then cosine to min_ratio."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(opt: torch.optim.Optimizer, factor: float) -> None:
    for g in opt.param_groups:
        g["lr"] = g["peak_lr"] * factor
