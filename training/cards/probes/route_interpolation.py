"""Probe (not part of the product): are two runs of the training route, each from scratch, in
one basin of the loss? A weight average (`training.soup`) only helps members that are.

`training.soup` refuses to average runs that did not start from the same trained weights. Two
runs of the route from the same seed share their initial weights and their data order, and
differ in what came after (here, the base's schedule). This walks the straight line between
their weights, w = (1 - t) a + t b, and scores each point on clean clips of the valid voices
(a fixed sample of the corpus `dlr-eval speech` scores it on, as the evaluation's
`sc12.clip_windows`): commands given their label and unknown words called a command, both by
argmax over the last frame. A large dip in the middle means two basins; none, one.

    PYTHONPATH=. python training/cards/probes/route_interpolation.py \\
        runs/route_accents/soup/model runs/route34/soup/model [--clips 1500] [--points 5]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, UNK, clip_windows
from training.eval_speech import EvalOptions, scoring_pools
from training.recipes.kws import last_frame_scores


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="a model directory (t = 0)")
    p.add_argument("b", help="another, of the same architecture (t = 1)")
    p.add_argument("--clips", type=int, default=1500, help="valid clips scored")
    p.add_argument("--points", type=int, default=5, help="points on the line, ends included")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(2)
    first, second = load_checkpoint(a.a).eval(), load_checkpoint(a.b).eval()
    kws = first.checkpoint_metadata["training"]["recipe_options"]["kws"]
    opts = EvalOptions()
    valid = scoring_pools(kws, kws.get("split", "final"), a.seed, opts)["valid"]
    rng = np.random.default_rng(a.seed)
    idx = np.sort(rng.choice(len(valid), min(a.clips, len(valid)), replace=False))
    audio = clip_windows(valid, idx, rir_bank(opts.cache_dir, seed=a.seed), a.seed, augment=False)
    labels = torch.from_numpy(valid.labels[idx])  # (clips,)
    commands, unknown = labels < min(SIL, UNK), labels == UNK
    sa = {k: v.clone() for k, v in first.state_dict().items()}  # first is overwritten below
    sb = second.state_dict()
    print("| t | commands given their label | unknown words called a command |")
    print("|---:|---:|---:|")
    for t in np.linspace(0.0, 1.0, a.points):
        mixed = {k: (1 - t) * v + t * sb[k] if v.is_floating_point() else v for k, v in sa.items()}
        first.load_state_dict(mixed)
        with torch.no_grad():
            pred = last_frame_scores(first, audio).argmax(-1)  # (clips,)
        found = (pred[commands] == labels[commands]).float().mean().item()
        accepted = (pred[unknown] < min(SIL, UNK)).float().mean().item()
        print(f"| {t:.2f} | {100 * found:.1f} % | {100 * accepted:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
