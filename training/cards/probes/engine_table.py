"""Probe (not part of the product): several scored models side by side, per engine of the test set.

Each ``NAME=EVAL_DIR`` names a model and the folder of its ``dlr-eval speech`` results (the one
holding ``eval.json``). Prints a Markdown table: commands on clean clips per engine of the test
voices, all of them, and unknown words accepted (clean), so that models scored on the same test
set can be compared column by column.

    PYTHONPATH=. python training/cards/probes/engine_table.py \\
        shipped=runs/shipped_eval_more new=runs/more_ft/eval_clips
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", metavar="NAME=EVAL_DIR")
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


if __name__ == "__main__":
    main()
