"""Probe (not part of the product): how readable the synthesizer is in a model's features.

For the valid clips of a run's split (clean, `dlr-eval speech`'s windows and seed), takes what
the classifier scores at each clip's last frame (`Head.scored_features`) and fits a fresh
logistic regression to predict the clip's engine on a random half of the clips; prints its
accuracy on the other half beside the majority share (chance), and the share of the features'
variance between the engines' means (`training.invariance.domain_share`, the penalty of
`--invariance-weight`) over all clips, for commands and for every word.

    PYTHONPATH=. python training/cards/probes/engine_probe.py RUN_DIR [RUN_DIR ...]
        [--checkpoint model|last]   (the run's chosen checkpoint, or its last one)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dlr_runtime import load_checkpoint
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, clip_windows
from training.eval_speech import CLIP_SEED
from training.invariance import domain_share
from training.recipes.kws import KWSOptions, load_split


def probe_accuracy(z: torch.Tensor, y: torch.Tensor, seed: int = 0) -> float:
    """Logistic regression on a random half of (z, y), accuracy on the other half."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=gen)
    fit, held = perm[: len(y) // 2], perm[len(y) // 2 :]
    mu, sd = z[fit].mean(0), z[fit].std(0).clamp_min(1e-6)
    z = (z - mu) / sd
    torch.manual_seed(seed)
    probe = nn.Linear(z.shape[1], int(y.max()) + 1)
    opt = torch.optim.Adam(probe.parameters(), lr=0.02)
    for _ in range(500):
        opt.zero_grad()
        (F.cross_entropy(probe(z[fit]), y[fit]) + 1e-3 * probe.weight.square().sum()).backward()
        opt.step()
    return float((probe(z[held]).argmax(-1) == y[held]).float().mean())


def main(run: Path, checkpoint: str = "model") -> None:
    summary = json.loads((run / "summary.json").read_text())
    split = summary["recipe_options"]["kws"]["split"]
    model = load_checkpoint(run / checkpoint).eval()
    valid = load_split(KWSOptions(split=split), 0)["valid"]
    rirs = rir_bank(KWSOptions().cache_dir, seed=0)
    audio = clip_windows(valid, np.arange(len(valid)), rirs, CLIP_SEED, augment=False)
    with torch.no_grad():
        feats = torch.cat(
            [
                model.head.scored_features(model.hidden(audio[s : s + 64]))[:, -1]
                for s in range(0, len(audio), 64)
            ]
        )  # (N, H)
    names, eng = np.unique(valid.engines, return_inverse=True)
    y = torch.from_numpy(eng.astype(np.int64))
    chance = float(np.bincount(eng).max() / len(eng))
    cmd = torch.from_numpy(valid.labels < SIL)
    share_all = float(domain_share(feats.unsqueeze(0).double(), y.unsqueeze(0)))
    share_cmd = float(domain_share(feats[cmd].unsqueeze(0).double(), y[cmd].unsqueeze(0)))
    print(
        f"{run.name}/{checkpoint}: engines {[str(n) for n in names]}, {len(y)} clips; engine probe "
        f"{probe_accuracy(feats, y):.3f} (chance {chance:.3f}); domain share all "
        f"{share_all:.4f}, commands {share_cmd:.4f}",
        flush=True,
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--checkpoint", choices=("model", "last"), default="model")
    args = p.parse_args()
    torch.set_num_threads(1)
    for r in args.runs:
        main(r, args.checkpoint)
