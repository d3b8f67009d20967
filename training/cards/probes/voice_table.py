"""Probe (not part of the product): several models side by side on chosen voices, clean clips.

Each ``NAME=MODEL_DIR`` is a checkpoint folder. The voices are those of ``--engine`` in the
corpus the flags describe, kept to one part of a split preset with ``--part`` (``final:test``:
the voices no model of the ``final`` split trains on). Prints a Markdown table, one row per
voice, of commands recognised on clean clips and unknown words accepted (by argmax, as
``training.voice_check``), with the mean over the voices; with ``--png``, the commands per voice
as grouped bars.

    PYTHONPATH=. python training/cards/probes/voice_table.py shipped=models/speech-commands \\
        new=runs/new/model --more-engines --rhvoice-accents --engine rhvoice --part final:test
"""

from __future__ import annotations

import argparse

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from training.data.corpus import CorpusConfig, all_tts_voices, engines_for  # noqa: E402
from training.data.splits import split_voices  # noqa: E402
from training.voice_check import check_voices  # noqa: E402


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", metavar="NAME=MODEL_DIR")
    ap.add_argument("--engine", action="append", required=True)
    ap.add_argument("--more-engines", action="store_true")
    ap.add_argument("--rhvoice-accents", action="store_true")
    ap.add_argument("--part", default="", help="PRESET:PART, e.g. final:test (default: all)")
    ap.add_argument("--only", nargs="*", default=(), help="voice names to keep (default: all)")
    ap.add_argument("--cache-dir", default="runs/sc12cache")
    ap.add_argument("--png", default="")
    args = ap.parse_args()
    cfg = CorpusConfig(engines=engines_for(args.more_engines), rhvoice_accents=args.rhvoice_accents)
    keep = {v.key for v in all_tts_voices(cfg) if v.engine in args.engine}
    if args.part:
        preset, _, part = args.part.partition(":")
        keep &= {v.key for v in split_voices(all_tts_voices(cfg), preset)[part]}
    if args.only:
        keep = {k for k in keep if k.split(":", 1)[1] in args.only}
    per: dict[str, dict[str, dict]] = {}
    for arg in args.models:
        name, _, folder = arg.partition("=")
        check = check_voices(folder, cfg, args.engine, args.cache_dir)
        per[name] = {v: r for v, r in check.per_voice.items() if v in keep}
    voices = sorted(keep)
    print("| voice | " + " | ".join(per) + " |")
    print("|---|" + "---:|" * len(per))
    for v in voices:
        cells = [
            f"{_pct(per[m][v]['command_accuracy'])} ({_pct(per[m][v]['unknown_accepted'])})"
            for m in per
        ]
        print(f"| {v} | " + " | ".join(cells) + " |")
    means = []
    for m in per:
        cmd = np.mean([per[m][v]["command_accuracy"] for v in voices])
        unk = np.mean([per[m][v]["unknown_accepted"] for v in voices])
        worst = min(voices, key=lambda v, m=m: per[m][v]["command_accuracy"])
        means.append(f"{_pct(cmd)} ({_pct(unk)}); worst {worst.split(':', 1)[1]} "
                     f"{_pct(per[m][worst]['command_accuracy'])}")  # fmt: skip
    print(f"| mean of {len(voices)} voices | " + " | ".join(means) + " |")
    if args.png:
        plot(per, voices, args.png)


def plot(per: dict[str, dict[str, dict]], voices: list[str], path: str) -> None:
    """Grouped bars: commands on clean clips per voice, one bar per model."""
    fig, ax = plt.subplots(figsize=(max(8.0, min(16.0, 0.16 * len(voices) * len(per) + 2)), 4.2))
    width = 0.8 / len(per)
    x = np.arange(len(voices))
    for k, (name, rows) in enumerate(per.items()):
        ys = [100 * rows[v]["command_accuracy"] for v in voices]
        ax.bar(x + (k - (len(per) - 1) / 2) * width, ys, width, label=name)
    ax.axhline(95, color="k", lw=0.8, ls="--", label="goal 95 %")
    ax.set_xticks(x, [v.split(":", 1)[1] for v in voices], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("commands recognised, clean clips (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, ncol=len(per) + 1, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
