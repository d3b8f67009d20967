"""Probe (not part of the product): clip accuracy and unknown-word acceptance of one model on
each split's voices (train, valid, test), clean and augmented, so the gap between the voices it
learned from and the unheard ones can be read off. A model that accepts many unknown words of
its own training voices underfits the rejection; one that rejects them but not the unheard
voices' words does not generalise it.

    PYTHONPATH=. python training/cards/probes/split_gap.py models/speech-commands \\
        [--max-clips 4000] [--rhvoice-accents]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from training.data.rooms import rir_bank
from training.data.sc12 import SIL, UNK, WordPool, clip_windows
from training.data.vocab import NEAR_MISSES, SC12_LABELS
from training.eval_speech import CLIP_SEED, clip_sample, frame_scores
from training.recipes.kws import KWSOptions, load_split


def as_command(pred: np.ndarray, words: np.ndarray, word: str) -> str:
    """The command that `word`'s accepted clips are most often taken for, with its count."""
    taken = Counter(SC12_LABELS[k] for k in pred[(words == word) & (pred < SIL)].tolist())
    label, n = taken.most_common(1)[0]
    return f"{label} {n}"


def clip_args(ap: argparse.ArgumentParser, max_clips: int, splits: list[str]) -> None:
    """The arguments of a probe on the final split's clips (this one and asr_audit.py)."""
    ap.add_argument("model")
    ap.add_argument("--max-clips", type=int, default=max_clips)
    ap.add_argument("--rhvoice-accents", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--splits", nargs="+", default=splits)


def clip_setup(a: argparse.Namespace) -> tuple[torch.nn.Module, dict[str, WordPool], list]:
    """The model, the final split's pools (the shipped recipe's voices) and the room bank."""
    torch.set_num_threads(1)
    model = load_checkpoint(a.model).eval()
    opts = KWSOptions(split="final", more_engines=True, rhvoice_accents=a.rhvoice_accents)
    return model, load_split(opts, a.seed), rir_bank(opts.cache_dir, seed=a.seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    clip_args(ap, 4000, ["train", "valid", "test"])
    ap.add_argument("--top", type=int, default=25, help="most accepted unknown words shown")
    a = ap.parse_args()
    model, pools, rirs = clip_setup(a)
    out: dict[str, dict[str, float]] = {}
    for name in a.splits:
        pool = pools[name]
        idx = clip_sample(len(pool), a.max_clips, a.seed, salt=0x5A9)
        lab = pool.labels[idx]
        for kind in ("clean", "augmented"):
            audio = clip_windows(pool, idx, rirs, a.seed + CLIP_SEED, augment=kind == "augmented")
            pred = frame_scores(model, audio)[:, -1].argmax(-1).numpy()
            cmd, unk = lab < SIL, lab == UNK
            row = {
                "clips": int(len(idx)),
                "commands": float((pred[cmd] == lab[cmd]).mean()),
                "unknown_accepted": float((pred[unk] < SIL).mean()),
                "commands_called_unknown": float((pred[cmd] == UNK).mean()),
            }
            words = pool.words[idx][unk]
            acc = pred[unk] < SIL
            near = np.isin(words, list(NEAR_MISSES))
            row["near_miss_accepted"] = float(acc[near].mean())
            row["other_accepted"] = float(acc[~near].mean())
            out[f"{name}/{kind}"] = row
            engines = pool.engines[idx][unk]
            row |= {
                f"near_miss_accepted/{e}": float(acc[near & (engines == e)].mean())
                for e in sorted(set(engines[near].tolist()))
            }
            tot = Counter(words.tolist())
            tops = Counter(words[acc].tolist()).most_common(a.top)
            taken = pred[unk]
            print(
                "  most accepted (word n/clips -> the command most taken for): "
                + ", ".join(f"{w} {c}/{tot[w]} -> {as_command(taken, words, w)}" for w, c in tops)
            )
            print(f"{name:5s} {kind:9s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
