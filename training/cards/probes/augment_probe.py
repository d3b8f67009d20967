"""Probe (not part of the product): which augmentation costs a model its commands?

`dlr-eval speech` scores the test voices' command clips clean and through the whole training
augmentation at once (`sc12.clip_windows(augment=True)`: speed, reverb, background, channel,
level, each drawn at random). This probe takes the same command clips through one effect at
a time, everything else held at a neutral setting (no speed change, no room, no channel
filter, a background 50 dB under the speech, the window's peak at -10 dBFS, no clipping), and
reports each model's command accuracy per effect, so a front end's loss on augmented clips
can be traced to the effect that causes it.

    PYTHONPATH=. python training/cards/probes/augment_probe.py \\
        "log-mel (shipped)=models/speech-commands" "embedding=runs/m22_se_cap2/model" \\
        --clips 1200 --out training/cards/augment-probe.json

``--png FILE`` draws the table (one bar per model and effect); with ``--from-json FILE`` it is
drawn from a saved table without scoring anything again.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from dlr_runtime import load_checkpoint
from training.data.rooms import RoomConfig, rir_bank
from training.data.sc12 import SIL, clip_windows
from training.eval_speech import frame_scores
from training.recipes.kws import KWSOptions, load_split

SEED = 0xA06
NEUTRAL = RoomConfig(
    speed_prob=0.0,
    reverb_prob=0.0,
    telephone_prob=0.0,
    lowpass_prob=0.0,
    highpass_prob=0.0,
    snr_db=(50.0, 50.0),
    peak_dbfs=(-10.0, -10.0),
    clip_prob=0.0,
)
# effect -> the neutral room with that one effect switched on (always, over its whole range)
EFFECTS: dict[str, RoomConfig] = {
    "none": NEUTRAL,
    "speed 0.85-1.15": replace(NEUTRAL, speed_prob=1.0),
    "room reverb": replace(NEUTRAL, reverb_prob=1.0),
    "telephone band": replace(NEUTRAL, telephone_prob=1.0),
    "low-pass 2-7 kHz": replace(NEUTRAL, lowpass_prob=1.0),
    "high-pass 80-400 Hz": replace(NEUTRAL, highpass_prob=1.0),
    "background, SNR 20-30 dB": replace(NEUTRAL, snr_db=(20.0, 30.0)),
    "background, SNR 10-20 dB": replace(NEUTRAL, snr_db=(10.0, 20.0)),
    "background, SNR 0-10 dB": replace(NEUTRAL, snr_db=(0.0, 10.0)),
    "quiet, peak -45..-30 dBFS": replace(NEUTRAL, peak_dbfs=(-45.0, -30.0)),
    "clipped 0-10 dB": replace(NEUTRAL, clip_prob=1.0),
    "all (the evaluation's augmented)": RoomConfig(),
}


def plot_bars(
    table: dict[str, dict[str, float]], xlabel: str, title: str, png: str, ncol: int = 0
) -> None:
    """``table[effect][name]`` (a share) as bars, one per name, the effects top to bottom."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    effects = list(table)
    names = list(table[effects[0]])
    height = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(9, 0.18 * len(names) * len(effects) + 2.2))
    y = np.arange(len(effects))
    for i, name in enumerate(names):
        vals = [100 * table[e][name] for e in effects]
        ax.barh(y + (i - (len(names) - 1) / 2) * height, vals, height, label=name)
    ax.set_yticks(y, effects)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=ncol or len(names), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def plot(results: dict, png: str) -> None:
    """Command accuracy per effect, one bar per model."""
    plot_bars(
        results["command_accuracy"],
        f"commands right, % ({results['clips']} test-voice clips per effect)",
        "Command accuracy through one augmentation effect at a time",
        png,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="name=checkpoint directory")
    ap.add_argument("--clips", type=int, default=1200, help="command clips of the test voices")
    ap.add_argument("--rhvoice-accents", action="store_true")
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    ap.add_argument("--png", default=None, help="draw the table here")
    ap.add_argument("--from-json", default=None, help="a saved table instead of the models")
    a = ap.parse_args()
    if a.from_json:
        if a.models:
            ap.error("give models or --from-json, not both")
        if a.png:
            plot(json.loads(Path(a.from_json).read_text()), a.png)
        return
    if not a.models:
        ap.error("name at least one model (name=checkpoint directory) or --from-json")
    torch.set_num_threads(1)
    opts = KWSOptions(split="final", more_engines=True, rhvoice_accents=a.rhvoice_accents)
    test = load_split(opts, 0)["test"]
    commands = np.flatnonzero(test.labels < SIL)
    rng = np.random.default_rng(SEED)
    idx = np.sort(rng.choice(commands, min(a.clips, len(commands)), replace=False))
    lab = test.labels[idx]
    rirs = rir_bank(opts.cache_dir, seed=0)
    models = {}
    for spec in a.models:
        name, path = spec.split("=", 1)
        models[name] = load_checkpoint(path).eval()
    results: dict[str, dict] = {
        "clips": len(idx),
        "models": {s.split("=", 1)[0]: s.split("=", 1)[1] for s in a.models},
    }
    table: dict[str, dict[str, float]] = {}
    for effect, room in EFFECTS.items():
        audio = clip_windows(test, idx, rirs, SEED, augment=True, room=room)
        row = {}
        for name, model in models.items():
            with torch.no_grad():
                pred = frame_scores(model, audio)[:, -1].argmax(-1).numpy()
            row[name] = float((pred == lab).mean())
        table[effect] = row
        cells = ", ".join(f"{n} {100 * v:.1f} %" for n, v in row.items())
        print(f"{effect}: {cells}", flush=True)
    results["command_accuracy"] = table
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    if a.png:
        plot(results, a.png)


if __name__ == "__main__":
    main()
