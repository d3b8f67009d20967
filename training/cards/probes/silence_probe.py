"""Probe (not part of the product): which word-less windows does a model take for a command?

`dlr-eval speech` reports one figure, the share of its silence windows (every background kind
and level, `sc12.silence_windows`) whose last frame's argmax is a command. This probe scores
more such windows (the test voices' babble, as the evaluation draws them, on another seed) with
each model given, and splits that share by the window's level (RMS in dB of full scale) and
by the command taken, to see where a front end's extra false accepts come from.

    PYTHONPATH=. python training/cards/probes/silence_probe.py \\
        "log-mel (shipped)=models/speech-commands" "embedding=runs/m21_se_final/ema" \\
        --windows 3000 --out training/cards/silence-probe.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from training.data.sc12 import SIL, silence_windows
from training.eval_speech import frame_scores
from training.recipes.kws import KWSOptions, load_split

LEVELS_DB = (-60.0, -45.0, -30.0, -15.0)  # bin edges of the window's RMS, dB of full scale
SEED = 0x5113


def level_bins(audio: torch.Tensor) -> tuple[np.ndarray, list[str]]:
    """Each window's level bin index and the bins' names."""
    rms = audio.double().pow(2).mean(-1).sqrt().clamp_min(1e-12)
    db = (20 * rms.log10()).numpy()
    names = [f"< {LEVELS_DB[0]:g}"]
    names += [f"{a:g} .. {b:g}" for a, b in zip(LEVELS_DB[:-1], LEVELS_DB[1:], strict=True)]
    names += [f">= {LEVELS_DB[-1]:g}"]
    return np.digitize(db, LEVELS_DB), names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="name=checkpoint directory")
    ap.add_argument("--windows", type=int, default=3000)
    ap.add_argument("--rhvoice-accents", action="store_true")
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    opts = KWSOptions(split="final", more_engines=True, rhvoice_accents=a.rhvoice_accents)
    test = load_split(opts, 0)["test"]
    audio = silence_windows(a.windows, test, SEED)
    bins, names = level_bins(audio)
    counts = np.bincount(bins, minlength=len(names))
    shares = ", ".join(f"{n}: {c}" for n, c in zip(names, counts, strict=True))
    print(f"windows per level (dBFS): {shares}")
    results: dict[str, dict] = {"windows": a.windows, "levels": names, "per_level": counts.tolist()}
    for spec in a.models:
        name, path = spec.split("=", 1)
        model = load_checkpoint(path).eval()
        labels = list(model.config.labels)
        with torch.no_grad():
            pred = frame_scores(model, audio)[:, -1].argmax(-1).numpy()
        acc = pred < SIL  # a command's label
        per_level = [float(acc[bins == i].mean()) if counts[i] else None for i in range(len(names))]
        taken = {labels[c]: int((pred == c).sum()) for c in np.unique(pred[acc])}
        results[name] = {
            "model": path,
            "accepted": float(acc.mean()),
            "accepted_per_level": per_level,
            "commands_taken": dict(sorted(taken.items(), key=lambda kv: -kv[1])),
        }
        cells = ", ".join(
            f"{n}: {'-' if p is None else f'{100 * p:.1f} %'}"
            for n, p in zip(names, per_level, strict=True)
        )
        print(f"{name}: accepted {100 * acc.mean():.2f} % ({cells}); taken for {taken}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
