"""Probe (not part of the product): does a model tell a command from its near miss when both
are said by the same voice, in the same window, under the same effects?

It draws fresh minimal-pair windows (``sc12.py``, ``WindowConfig.p_pair = 1``) of one split's
voices, the training voices by default, with the training augmentation, and reads the model's
per-frame argmax on each word's hold frames (``hold_frame`` frames into the hold, about where a
clip evaluation reads its last frame): the share of near misses taken for a command, and the
share of commands given their label. A model that fits its training data should reject its
own training voices' near misses here, where only the word differs from a command it accepts.

    PYTHONPATH=. python training/cards/probes/pair_fit.py runs/m20_pair/ema \\
        [--windows 800] [--split train] [--rhvoice-accents] [--tiny-corpus --cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from dlr_runtime import load_checkpoint
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, UNK, KWSWindows, WordPool
from training.recipes.kws import KWSOptions, load_split, window_config


def pair_scores(
    model: torch.nn.Module, pool: WordPool, rirs: list, opts: KWSOptions, windows: int, hold: int
) -> dict[str, float]:
    """Fresh minimal-pair windows of `pool` through `model`: the share of near misses taken
    for a command and of commands given their label, `hold` frames into each word's hold."""
    ds = KWSWindows(pool, rirs, window_config(replace(opts, p_pair=1.0)), 0x9A1, windows)
    pairs = near_taken = cmd_right = 0
    with torch.no_grad():
        for s in range(0, windows, 32):
            items = [ds[k] for k in range(s, min(windows, s + 32))]
            pred = model(torch.stack([it.audio for it in items])).argmax(-1)  # (b, F)
            for it, p in zip(items, pred, strict=True):
                t = it.targets[: len(p)]
                near = (t == UNK).nonzero().flatten()
                cmd = (t == it.pair_cmd).nonzero().flatten()
                if it.pair_cmd < 0 or not len(near) or not len(cmd):
                    continue  # a word-less window, or the second word cut by the window's end
                pairs += 1
                near_taken += int(p[near[min(len(near) - 1, hold)]] < SIL)
                cmd_right += int(p[cmd[min(len(cmd) - 1, hold)]] == it.pair_cmd)
    return {
        "pairs": pairs,
        "near_miss_taken_for_a_command": near_taken / max(1, pairs),
        "command_right": cmd_right / max(1, pairs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--windows", type=int, default=800)
    ap.add_argument("--split", default="train", choices=["train", "valid", "test"])
    ap.add_argument("--hold-frame", type=int, default=12)
    ap.add_argument("--rhvoice-accents", action="store_true")
    ap.add_argument("--tiny-corpus", action="store_true")
    ap.add_argument("--cache-dir", default=KWSOptions.cache_dir)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_checkpoint(args.model).eval()
    opts = KWSOptions(
        cache_dir=args.cache_dir,
        more_engines=not args.tiny_corpus,
        rhvoice_accents=args.rhvoice_accents,
        tiny_corpus=args.tiny_corpus,
    )
    pool = load_split(opts, args.seed)[args.split]
    rirs = rir_bank(opts.cache_dir, seed=args.seed)
    scores = pair_scores(model, pool, rirs, opts, args.windows, args.hold_frame)
    print(json.dumps({"model": args.model, "split": args.split, **scores}))


if __name__ == "__main__":
    main()
