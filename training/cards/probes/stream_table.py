"""Probe (not part of the product): several models' stream results side by side.

Each ``NAME=EVAL_DIR`` names a model and the folder of its ``dlr-eval speech`` results with
streams (``eval.json``). Prints a Markdown table: the operating point chosen on the valid
streams, the valid and test streams at that point, and the best test recall within 0.5 / 1 /
10 / 20 false accepts per hour on the test curve (a threshold picked on the test streams
themselves: what a shared threshold could give at best, not a chosen point).

    PYTHONPATH=. python training/cards/probes/stream_table.py \\
        shipped=runs/m8_soup/model/eval route=runs/m11_soup/model/eval
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LIMITS = (0.5, 1.0, 10.0, 20.0)  # false accepts per hour


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def best_within(curve: list[dict], limit: float) -> float:
    """The highest recall among the curve's points with at most `limit` false accepts / h."""
    return max((p["recall"] for p in curve if p["fa_per_hour"] <= limit), default=0.0)


def row(name: str, streams: dict) -> str:
    op, v, t = (
        streams["operating_point"],
        streams["valid_at_operating_point"],
        streams["test_at_operating_point"],
    )
    best = " / ".join(_pct(best_within(streams["test"]["curve"], b)) for b in LIMITS)
    return (
        f"| {name} | {op['threshold']:g} over {op['smooth_ms']:g} ms | "
        f"{_pct(v['recall'])} at {v['fa_per_hour']:.0f} FA/h | "
        f"{_pct(t['recall'])} at {t['fa_per_hour']:.0f} FA/h | {best} | "
        f"{t['delay_median_s']:.2f} s |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", metavar="NAME=EVAL_DIR")
    args = ap.parse_args()
    limits = " / ".join(f"{b:g}" for b in LIMITS)
    print(
        "| model | point (chosen on valid) | valid streams | test streams at that point | "
        f"best test recall within {limits} FA/h | median delay |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for arg in args.models:
        name, _, folder = arg.partition("=")
        print(row(name, json.loads((Path(folder) / "eval.json").read_text())["streams"]))


if __name__ == "__main__":
    main()
