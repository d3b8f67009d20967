"""Probe (not part of the product): several scored models side by side, per engine of the test set.

Each ``NAME=EVAL_DIR`` names a model and the folder of its ``dlr-eval speech`` results (the one
holding ``eval.json``). Prints a Markdown table: commands on clean clips per engine of the test
voices, all of them, and unknown words accepted (clean), so that models scored on the same test
set can be compared column by column; with ``--png``, a bar chart of the commands per engine and
model.

    PYTHONPATH=. python training/cards/probes/engine_table.py \\
        shipped=runs/shipped_eval_more new=runs/more_ft/eval_clips [--png out.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", metavar="NAME=EVAL_DIR")
    ap.add_argument("--png", default="", help="also draw the commands per engine here")
    args = ap.parse_args()
    results = {}
    for arg in args.models:
        name, _, folder = arg.partition("=")
        results[name] = json.loads((Path(folder) / "eval.json").read_text())
    engines = sorted({e for r in results.values() for e in r["clean"]["per_engine"]})
    head = ["model", *engines, "all", "unknown accepted", "commands, augmented"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for name, r in results.items():
        per = r["clean"]["per_engine"]
        cells = [_pct(per[e]["command_accuracy"]) if e in per else "-" for e in engines]
        cells += [
            _pct(r["clean"]["command_accuracy"]),
            _pct(r["clean"]["unknown_accepted"]),
            _pct(r["augmented"]["command_accuracy"]),
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.png:
        plot(results, engines, args.png)


def plot(results: dict[str, dict], engines: list[str], path: str) -> None:
    """Grouped bars: commands on clean clips per engine of the test voices, one bar per model."""
    cols = [*engines, "all"]
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(cols)) + 3, 3.8))
    width = 0.8 / len(results)
    for k, (name, r) in enumerate(results.items()):
        per = r["clean"]["per_engine"]
        vals = [per[e]["command_accuracy"] if e in per else None for e in engines]
        vals.append(r["clean"]["command_accuracy"])
        xs = [i + (k - (len(results) - 1) / 2) * width for i, v in enumerate(vals) if v is not None]
        ax.bar(xs, [100 * v for v in vals if v is not None], width, label=name)
    ax.set_xticks(range(len(cols)), cols, fontsize=8)
    ax.set_ylabel("commands of the test voices (clean, %)")
    ax.axhline(95, color="k", ls=":", lw=1)
    ax.text(len(cols) - 0.5, 96, "goal 95 %", ha="right", fontsize=8)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
