"""Probe (not part of the product): how long do a speech model's modes remember, and does
capping the slowest of them mend its clips after a long stream?

For each model: the time constant of every mode (tau = -frame / ln|lambda|, in seconds) per
layer, and the training recipe's valid clips scored from a zero state and after 60 s of a valid
stream (`KWSRecipe.evaluate`'s context_* metrics), as trained and with every mode slower than
`--cap` seconds made that slow (|lambda| lowered to exp(-frame / cap); faster modes as they
are; nothing retrained). A model trained on 2.4 s windows never saw a mode that remembers for
minutes reach its steady state; a live stream does.

    PYTHONPATH=. python training/cards/probes/memory_probe.py models/speech-commands \\
        runs/m21_se_final/model --cap 2 4 8
"""

from __future__ import annotations

import argparse
import copy
import math

import torch

from dlr_runtime import load_checkpoint
from dlr_runtime.model import DLRModel
from dlr_runtime.ssm import DLRLayer
from training.config import TrainConfig
from training.distributed import DistContext
from training.modelopts import ModelOptions
from training.recipes.kws import KWSOptions, KWSRecipe

METRICS = ("accuracy", "command_accuracy", "false_accept")


def taus(model: DLRModel) -> list[torch.Tensor]:
    """Each layer's mode time constants in seconds."""
    frame_s = model.config.frame_stride / model.config.sample_rate
    out = []
    for blk in model.blocks:
        re = blk.ssm.recurrent_params().log_lam.real.flatten()  # ln |lambda| < 0
        out.append(-frame_s / re)
    return out


def capped(model: DLRModel, cap_s: float) -> DLRModel:
    """A copy whose modes remember at most `cap_s` seconds (faster ones unchanged)."""
    m = copy.deepcopy(model)
    frame_s = m.config.frame_stride / m.config.sample_rate
    for blk in m.blocks:
        ssm = blk.ssm
        if not isinstance(ssm, DLRLayer):
            raise SystemExit("the cap is written for the dlr layer (Re Lambda = -(p^2 + floor))")
        floor = max(frame_s / cap_s - ssm.min_decay, 0.0)  # p^2 at least this
        with torch.no_grad():
            ssm.p.copy_(torch.where(ssm.p.abs() ** 2 < floor, math.sqrt(floor), ssm.p.abs()))
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--cap", type=float, nargs="*", default=[2.0, 4.0, 8.0], help="seconds")
    a = ap.parse_args()
    torch.set_num_threads(1)
    opts = KWSOptions(
        split="final", more_engines=True, rhvoice_accents=True, frontend="speech_embedding"
    )  # (the embedding's framing only sets whole 80 ms frames of the context stream)
    recipe = KWSRecipe(opts, ModelOptions(), TrainConfig())
    recipe.setup(DistContext())
    print("model | cap | tau s: median / p90 / max | valid acc / commands / FA | after 60 s")
    for d in a.models:
        model = load_checkpoint(d).eval()
        for cap in [None, *a.cap]:
            m = model if cap is None else capped(model, cap)
            t = torch.cat(taus(m))
            q = torch.quantile(t, torch.tensor([0.5, 0.9], dtype=t.dtype)).tolist()
            r = recipe.evaluate(m, torch.device("cpu"))
            plain = " / ".join(f"{r[k]:.3f}" for k in METRICS)
            ctx = " / ".join(f"{r['context_' + k]:.3f}" for k in METRICS)
            tau = f"{q[0]:.2f} / {q[1]:.1f} / {t.max().item():.0f}"
            print(f"{d} | {cap or '-'} | {tau} | {plain} | {ctx}", flush=True)


if __name__ == "__main__":
    main()
