"""Probe (not part of the product): does silence dilute the smoothed posterior of a command?

The detector smooths softmax posteriors over ``smooth_ms``; in the frames around a word's end
``_silence_`` takes part of the mass, so a command's mean may fall short of the threshold. This
probe renormalises each frame's posterior over the non-silence classes, dividing them by
max(1 - p(_silence_), ``floor``) (the remainder stays on ``_silence_``, so a silent frame stays
silent), then runs the same detector. Streams: the evaluation's (`dlr-eval speech`'s seeds and
lengths) through the server's gate. For each rule and smoothing window it prints the valid
streams at the evaluation's point within 10 false accepts per hour (`global_point`: the lowest
threshold of a finer grid within the budget) and the test streams at that point.

    PYTHONPATH=. python training/cards/probes/silence_share_rule.py [MODEL] [--floors 0.3 0.5 0.7]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from dlr_runtime import load_checkpoint, to_recurrent
from dlr_runtime.kws import SILENCE, KWSConfig, softmax
from dlr_runtime.listen import gated_scores
from training.data.rooms import rir_bank
from training.eval_speech import THRESHOLDS, split_streams
from training.operating_point import global_point
from training.recipes.kws import KWSOptions, load_split
from training.streams import score

GRID = sorted({*THRESHOLDS, 0.45, 0.55, 0.65, 0.82, 0.83, 0.84, 0.94, 0.96})


def without_silence(sil: int, floor: float) -> Callable[[np.ndarray], np.ndarray]:
    """(F, C) logits -> logits whose softmax is the posterior renormalised off `_silence_`."""

    def rule(sc: np.ndarray) -> np.ndarray:
        p = softmax(sc)
        q = p / np.maximum(1.0 - p[:, sil], floor)[:, None]
        q[:, sil] = 0.0
        q[:, sil] = np.clip(1.0 - q.sum(1), 0.0, 1.0)
        return np.log(q + 1e-30)

    return rule


def main(model_dir: str, floors: list[float]) -> None:
    torch.set_num_threads(1)
    model = load_checkpoint(model_dir).eval()
    cfg = model.config
    labels = list(cfg.labels)
    frame_ms = 1000 * cfg.frame_stride / cfg.sample_rate
    rec = to_recurrent(model, dtype=torch.complex64)
    pools = load_split(KWSOptions(split="final"), 0)
    rirs = rir_bank(KWSOptions().cache_dir, seed=0)
    per = {
        name: [(gated_scores(rec, s.audio), s) for s in split_streams(pools, name, 60, rirs, 0)]
        for name in ("valid", "test")
    }
    rules = {"as shipped": lambda sc: sc}
    rules |= {
        f"off silence, floor {f:g}": without_silence(labels.index(SILENCE), f) for f in floors
    }
    base = replace(KWSConfig.from_metadata(model.checkpoint_metadata), keywords={})
    for name, rule in rules.items():
        v = [(rule(sc), s) for sc, s in per["valid"]]
        t = [(rule(sc), s) for sc, s in per["test"]]
        for ms in (60.0, 100.0, 200.0, 300.0, 400.0):
            at = replace(base, smooth_ms=ms)
            g = global_point(
                [score(v, labels, frame_ms, replace(at, threshold=th)) for th in GRID], 10.0
            )
            if g.fa_per_hour > 10.0:
                print(f"{name:24s} {ms:3.0f} ms: nothing within 10 FA/h")
                continue
            te = score(t, labels, frame_ms, replace(at, threshold=g.threshold))
            print(
                f"{name:24s} {ms:3.0f} ms: valid {g.recall:.3f} (threshold {g.threshold:g}) -> "
                f"test {te.recall:.3f} at {te.fa_per_hour:.0f} FA/h",
                flush=True,
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="models/speech-commands")
    ap.add_argument("--floors", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    a = ap.parse_args()
    main(a.model, a.floors)
