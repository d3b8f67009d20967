"""Probe (not part of the product): does a training lever move the trade between finding
commands and rejecting other words, or only slide along it?

Every lever tried on rejection so far (near misses drawn more often, the dictionary's near
misses, a verifier) gave fewer unknown words accepted *and* fewer commands found. A bias b on
the `_unknown_` logit (`training/kws_calibrate.py`) slides any one model along its own trade
curve, so two models are compared fairly only as curves: for each b in a grid, the share of
command clips given their label against the share of unknown-word clips called a command (by
argmax over the last frame, as the clip evaluation and the server's utterance mode). A lever
that helps puts its curve above the others', not one point of it.

The clips are the evaluation's (`sc12.clip_windows`): each split's voices, clean and augmented,
at most `--max-clips` of them (the same sample for every model). The plot shows one panel per
split and kind; the table prints the commands found at a few shares of unknown words accepted
(read off each curve; "-" where the curve does not reach it).

    PYTHONPATH=. python training/cards/probes/rejection_curve.py \\
        "shipped=runs/m15_soup4/model" "near misses 0.5=runs/m15_nm/ema" \\
        [--splits valid test] [--max-clips 8000] [--png training/cards/rejection-curves.png] \\
        [--no-rhvoice-accents]

A model whose `_unknown_` is a union of classes (`--unknown-classes`) may be named twice, as
``NAME=DIR`` (the union's probability, what it computes) and ``NAME=DIR@max`` (its most likely
class alone).

The split has RHVoice's voices of other languages (the shipped recipe's) unless
``--no-rhvoice-accents``: then its test voices are the card's (`dlr-eval speech` without
``--rhvoice-accents``), without the sixteen accented test-only voices.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from dlr_runtime.unknown_head import RULES, UnionLinear
from training.data.rooms import rir_bank
from training.data.sc12 import clip_windows
from training.eval_speech import (
    CLIP_SEED,
    SWEEP_BIASES,
    clip_sample,
    commands_within,
    frame_scores,
    rejection_sweep,
)
from training.recipes.kws import KWSOptions, load_split

AT = (0.02, 0.04, 0.06)  # unknown words accepted, where the table reads each curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="NAME=CHECKPOINT_DIR")
    ap.add_argument("--splits", nargs="+", default=["valid", "test"])
    ap.add_argument("--max-clips", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--png", default="")
    ap.add_argument(
        "--no-rhvoice-accents",
        action="store_true",
        help="leave RHVoice's sixteen accented test-only voices out (the card's test set)",
    )
    a = ap.parse_args()
    torch.set_num_threads(1)
    opts = KWSOptions(split="final", more_engines=True, rhvoice_accents=not a.no_rhvoice_accents)
    pools = load_split(opts, a.seed)
    rirs = rir_bank(opts.cache_dir, seed=a.seed)
    windows: dict[str, tuple[torch.Tensor, np.ndarray]] = {}
    for name in a.splits:
        pool = pools[name]
        idx = clip_sample(len(pool), a.max_clips, a.seed, salt=0x5A9)
        for kind in ("clean", "augmented"):
            audio = clip_windows(pool, idx, rirs, a.seed + CLIP_SEED, augment=kind == "augmented")
            windows[f"{name}/{kind}"] = (audio, pool.labels[idx])
    curves: dict[str, dict[str, list[dict[str, float]]]] = {}
    for spec in a.models:
        label, path = spec.split("=", 1)
        path, _, rule = path.partition("@")
        model = load_checkpoint(path).eval()
        if rule:  # a union head scored by another rule (dlr_runtime/unknown_head.py)
            if not isinstance(model.head.proj, UnionLinear) or rule not in RULES:
                raise SystemExit(f"{spec}: @{rule} needs a union head and one of {RULES}")
            model.head.proj.rule = rule
        curves[label] = {}
        for key, (audio, labels) in windows.items():
            curves[label][key] = rejection_sweep(frame_scores(model, audio)[:, -1], labels)
    head = " | ".join(f"{k} at {t:.0%}" for k in windows for t in AT)
    print(f"| model | {head} | commands at b=0 |")
    print("|---|" + "---:|" * (len(windows) * len(AT) + 1))
    zero = SWEEP_BIASES.index(0.0)
    for label, per in curves.items():
        cells = []
        for key in windows:
            for t in AT:
                v = commands_within(per[key], t)
                cells.append("-" if v is None else f"{100 * v:.1f} %")
        z = "; ".join(
            f"{k}: {100 * per[k][zero]['command_accuracy']:.1f} % / "
            f"{100 * per[k][zero]['unknown_accepted']:.1f} %"
            for k in windows
        )
        print(f"| {label} | " + " | ".join(cells) + f" | {z} |")
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = (len(curves) + 1) // 2  # legend lines under the panels
        fig, axes = plt.subplots(
            1, len(windows), figsize=(4.6 * len(windows), 4 + 0.22 * rows), squeeze=False
        )
        for ax, key in zip(axes[0], windows, strict=True):
            for label, per in curves.items():
                fa = np.array([100 * p["unknown_accepted"] for p in per[key]])
                found = np.array([100 * p["command_accuracy"] for p in per[key]])
                (line,) = ax.plot(fa, found, label=label, lw=1.2)
                ax.plot(fa[zero], found[zero], "o", color=line.get_color(), ms=4)
            ax.axvline(2.0, color="grey", ls=":", lw=0.8)
            ax.set_xlim(0, 15)
            ax.set_title(key, fontsize=9)
            ax.set_xlabel("unknown words accepted (%)")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("commands found (%)")
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, fontsize=7, loc="lower center", ncol=2, frameon=False)
        fig.suptitle(
            "commands against unknown words accepted, as the _unknown_ bias sweeps "
            "(dot: no bias; dotted: the 2 % goal)",
            fontsize=9,
        )
        fig.tight_layout(rect=(0, 0.055 * rows, 1, 1))
        fig.savefig(a.png, dpi=110)
        print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
