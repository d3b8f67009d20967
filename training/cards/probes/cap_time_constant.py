"""Probe (not part of the product): a copy of a dlr model whose slowest modes are capped at
a time constant, after training: Re Lambda <= -frame_s / tau_s (p^2 raised to that floor).

    PYTHONPATH=. python training/cards/probes/cap_time_constant.py MODEL OUT TAU_S
"""

from __future__ import annotations

import math
import sys

import torch

from dlr_runtime import load_checkpoint, save_checkpoint


def main(model_dir: str, out: str, tau_s: float) -> None:
    model = load_checkpoint(model_dir).eval()
    cfg = model.config
    floor = cfg.frame_stride / cfg.sample_rate / tau_s  # per-frame decay of that time constant
    capped = 0
    with torch.no_grad():
        for block in model.blocks:
            p = block.ssm.p  # Re Lambda = -(p^2 + min_decay)
            slow = p.double() ** 2 + cfg.min_decay < floor
            capped += int(slow.sum())
            p[slow] = math.sqrt(floor - cfg.min_decay)
    save_checkpoint(model, out, **model.checkpoint_metadata)
    print(f"{capped} modes capped at {tau_s:g} s -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
