"""Probe (not part of the product): leave-one-synthesizer-out folds of several recipes side by side.

Each ``--arm NAME MODEL_DIR ...`` names a recipe and its fold checkpoints (a run's ``model/`` or
``last/``), each already scored by ``dlr-eval speech MODEL_DIR --stream-minutes 0`` (its
``eval/eval.json``); ``--arm-json NAME FILE`` reads an arm's figures from a JSON file instead
(``{"<engine>": [commands, unknown accepted], ...}``, fractions; keys starting "_" are notes), for folds scored in an earlier
session whose run directories are gone; ``--arm-loso NAME FILE`` reads them from the fold records
a model card keeps (``training.kws_card --save-loso``). Prints a Markdown table (commands on clean clips of the unheard engine,
unknown words accepted in brackets, per fold and their mean) and, with ``--png``, a bar chart of
the commands per fold and arm; ``--save-json FILE`` writes the last ``--arm``'s figures in the
``--arm-json`` format, so a later session can draw them once the runs are gone.

    PYTHONPATH=. python training/cards/probes/fold_compare.py \\
        --arm control runs/ctl_loso-*/last --arm phonemes runs/pho_loso-*/last --png out.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fold_scores(model_dir: str) -> tuple[str, float, float]:
    """(held-out engine, commands on clean clips, unknown words accepted) of one scored fold."""
    res = json.loads((Path(model_dir) / "eval" / "eval.json").read_text())
    held = res["split"].removeprefix("loso-")
    return held, res["clean"]["command_accuracy"], res["clean"]["unknown_accepted"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arm", nargs="+", action="append", default=[], metavar="NAME DIR")
    ap.add_argument("--arm-json", nargs=2, action="append", default=[], metavar=("NAME", "FILE"))
    ap.add_argument("--arm-loso", nargs=2, action="append", default=[], metavar=("NAME", "FILE"))
    ap.add_argument("--png", default="")
    ap.add_argument("--save-json", default="", help="the last --arm's figures, as --arm-json")
    args = ap.parse_args()
    arms: dict[str, dict[str, tuple[float, float]]] = {}
    for name, file in args.arm_json:
        table = json.loads(Path(file).read_text())  # keys starting "_" are notes
        arms[name] = {h: (float(v[0]), float(v[1])) for h, v in table.items() if h[0] != "_"}
    for name, file in args.arm_loso:
        folds = json.loads(Path(file).read_text())["folds"]
        arms[name] = {f["engine"]: (f["clean_commands"], f["unknown_accepted"]) for f in folds}
    for name, *dirs in args.arm:
        arms[name] = {h: (c, u) for h, c, u in map(fold_scores, dirs)}
    if not arms:
        ap.error("give at least one --arm or --arm-json")
    if args.save_json:
        if not args.arm:
            ap.error("--save-json writes an --arm's figures: give one")
        name, *dirs = args.arm[-1]
        record = {"_source": f"{name}: " + ", ".join(dirs)} | {
            h: list(v) for h, v in sorted(arms[name].items())
        }
        Path(args.save_json).write_text(json.dumps(record, indent=1) + "\n")
    folds = sorted({f for scores in arms.values() for f in scores})
    print("| held out | " + " | ".join(arms) + " |")
    print("|---" * (len(arms) + 1) + "|")
    for f in [*folds, "mean"]:
        cells = []
        for scores in arms.values():
            if f == "mean":
                vals = list(scores.values())
                c = sum(v[0] for v in vals) / len(vals)
                u = sum(v[1] for v in vals) / len(vals)
                cells.append(
                    f"{100 * c:.1f} % ({100 * u:.1f} %)"
                    + ("" if len(vals) == len(folds) else f" [{len(vals)} folds]")
                )
            elif f in scores:
                c, u = scores[f]
                cells.append(f"{100 * c:.1f} % ({100 * u:.1f} %)")
            else:
                cells.append("-")
        print(f"| {f} | " + " | ".join(cells) + " |")
    if args.png:
        fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(folds)), 3.6))
        width = 0.8 / len(arms)
        for k, (name, scores) in enumerate(arms.items()):
            xs = [i + (k - (len(arms) - 1) / 2) * width for i, f in enumerate(folds) if f in scores]
            ys = [100 * scores[f][0] for f in folds if f in scores]
            ax.bar(xs, ys, width, label=name)
        ax.set_xticks(range(len(folds)), [f"without {f}" for f in folds], fontsize=8)
        ax.set_ylabel("commands of the unheard engine (clean, %)")
        ax.axhline(95, color="k", ls=":", lw=1)
        ax.text(len(folds) - 0.5, 96, "goal 95 %", ha="right", fontsize=8)
        ax.set_ylim(0, 100)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
