"""Probe (not part of the product): does a union head (`--unknown-classes`) know which unknown
word it heard?

A model whose `_unknown_` is the union of one class per unknown word of the corpus
(`dlr_runtime/unknown_head.py`) can be scored two ways: by the union's probability (what it
computes, the logsumexp of the classes' logits) or by its most likely class alone (the "max"
rule of `rejection_curve.py`). The max rule only rejects a word well when the model puts that
word's mass on one class, so this probe measures, on each split's clean unknown-word clips
(the evaluation's clips, `sc12.clip_windows`), how often the most likely unknown class is the
word said (top-1 and top-5 among the K classes), how much of the union's probability that
class holds, and the share of the clips the union rule and the max rule call a command; near
misses of a command and other words apart.

    PYTHONPATH=. python training/cards/probes/union_words.py runs/m25_union/ema \\
        [--max-clips 3000] [--splits train valid test] [--rhvoice-accents]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dlr_runtime.unknown_head import group
from training.cards.probes.split_gap import clip_args, clip_setup
from training.data.sc12 import SIL, UNK, clip_windows
from training.data.vocab import NEAR_MISSES
from training.eval_speech import CLIP_SEED, clip_sample


@torch.no_grad()
def last_frame_fine(model: torch.nn.Module, audio: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """Every class's logit after the last frame of each window (N, C - 1 + K), offline."""
    outs = []
    for s in range(0, len(audio), batch):
        f = model.head.scored_features(model.hidden(audio[s : s + batch]))[:, -1]
        outs.append(model.head.proj.fine(f).float())
    return torch.cat(outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    clip_args(ap, 3000, ["train", "valid", "test"])
    a = ap.parse_args()
    model, pools, rirs = clip_setup(a)
    k = model.config.unknown_classes
    if not k:
        raise SystemExit(f"{a.model}: not a union head (no unknown classes)")
    summary = Path(a.model).parent / "summary.json"  # the run's (its model/ or ema/ inside)
    vocab = json.loads(summary.read_text())["unknown_classes"]
    index = {w: i for i, w in enumerate(vocab)}
    out: dict[str, dict[str, float]] = {}
    for name in a.splits:
        pool = pools[name]
        unk = np.flatnonzero(pool.labels == UNK)
        unk = unk[clip_sample(len(unk), a.max_clips, a.seed, salt=0x0A1)]
        audio = clip_windows(pool, unk, rirs, a.seed + CLIP_SEED, augment=False)
        fine = last_frame_fine(model, audio)  # (n, SIL + 1 + K)
        words = pool.words[unk]
        want = torch.tensor([index[str(w)] for w in words])
        union = fine[:, UNK:]  # (n, K)
        top5 = union.topk(5, dim=-1).indices
        mass = union.softmax(-1).max(-1).values  # the top class's share of the union
        by_sum = group(fine, UNK + 1, "sum").argmax(-1) < SIL  # called a command
        by_max = group(fine, UNK + 1, "max").argmax(-1) < SIL
        near = torch.from_numpy(np.isin(words, NEAR_MISSES))
        row: dict[str, float] = {"clips": float(len(unk))}
        for part, m in (("all", torch.ones_like(near)), ("near misses", near), ("other", ~near)):
            if not bool(m.any()):
                continue
            row[f"{part}: top-1"] = float((top5[m, 0] == want[m]).float().mean())
            row[f"{part}: top-5"] = float((top5[m] == want[m, None]).any(-1).float().mean())
            row[f"{part}: top class's share of the union"] = float(mass[m].mean())
            row[f"{part}: accepted, union rule"] = float(by_sum[m].float().mean())
            row[f"{part}: accepted, max rule"] = float(by_max[m].float().mean())
        out[name] = row
        print(name, json.dumps({k2: round(v, 4) for k2, v in row.items()}), flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
