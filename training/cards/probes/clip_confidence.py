"""Probe (not part of the product): how often a held-out voice's command clears the firing threshold.

Argmax accuracy on clips (the card's "all" column) counts a command as found when its label
wins at the clip's last frame; the streams' detector needs its smoothed posterior (the mean of
the last ``smooth_ms`` of softmax outputs, `dlr_runtime.kws.KeywordSpotter`) to reach the
threshold. For every test clip (`dlr-eval speech`'s windows and seed, clean and augmented)
this prints per engine: argmax accuracy, the share of commands whose own smoothed posterior
peaks at or above the threshold (and above 0.6), their median peak, and the share of unknown
words on which some command's smoothed posterior reaches the threshold.

    PYTHONPATH=. python training/cards/probes/clip_confidence.py [MODEL] [--threshold 0.86]
        [--smooth-ms 300] [--split test|valid]

``--split valid`` screens a candidate on the valid speakers (what a choice between trainings
may look at); the card's figures are on ``test``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from dlr_runtime.kws import KeywordSpotter, KWSConfig
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, UNK, clip_windows
from training.eval_speech import CLIP_SEED, frame_scores
from training.recipes.kws import KWSOptions, load_split
from training.stream_anatomy import smoothed_posteriors


def main(model_dir: str, threshold: float, smooth_ms: float, split: str = "test") -> None:
    torch.set_num_threads(1)
    model = load_checkpoint(model_dir).eval()
    cfg = model.config
    frame_ms = 1000 * cfg.frame_stride / cfg.sample_rate
    k = KeywordSpotter(list(cfg.labels), frame_ms, KWSConfig(smooth_ms=smooth_ms)).k  # its window
    test = load_split(KWSOptions(split="final"), 0)[split]
    rirs = rir_bank(KWSOptions().cache_dir, seed=0)
    idx = np.arange(len(test))
    lab, eng = test.labels, test.engines
    for augment in (False, True):
        audio = clip_windows(test, idx, rirs, CLIP_SEED, augment=augment)  # run seed 0
        with torch.no_grad():
            sc = frame_scores(model, audio).double().numpy()  # (N, F, C)
        print("augmented" if augment else "clean")
        for e in sorted(set(eng)):
            cmd = np.flatnonzero((eng == e) & (lab < SIL))
            unk = np.flatnonzero((eng == e) & (lab == UNK))
            arg = float((sc[cmd, -1].argmax(-1) == lab[cmd]).mean())
            peak = np.array([smoothed_posteriors(sc[i], k)[:, lab[i]].max() for i in cmd])
            upeak = np.array([smoothed_posteriors(sc[i], k)[:, :SIL].max() for i in unk])
            print(
                f"  {e:9s} commands {len(cmd):4d}: argmax {arg:.3f}, peak >= {threshold:g} "
                f"{np.mean(peak >= threshold):.3f}, >= 0.6 {np.mean(peak >= 0.6):.3f}, median "
                f"peak {np.median(peak):.2f} | unknown words reaching {threshold:g}: "
                f"{np.mean(upeak >= threshold):.3f}",
                flush=True,
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="models/speech-commands")
    ap.add_argument("--threshold", type=float, default=0.86)
    ap.add_argument("--smooth-ms", type=float, default=300.0)
    ap.add_argument("--split", choices=("test", "valid"), default="test")
    a = ap.parse_args()
    main(a.model, a.threshold, a.smooth_ms, a.split)
