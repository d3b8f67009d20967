"""Rejection calibration of a keyword-spotting run: a bias on the `_unknown_` score, chosen on
the valid clips.

A model that finds more commands may also call more other words a command (a weight average
did: `models/speech-commands/MODEL.md`). Adding a constant b >= 0 to the `_unknown_` logit
moves that trade-off without training: it is a change of the classifier's bias, so the
offline, chunk and step forms, ONNX export and the server stay exact. b is the smallest value
on a grid whose *valid* clips (the recipe's held-out clips, augmented, plus word-less windows)
accept at most `--false-accept` of the non-command clips as a command by argmax, which is what
the server's utterance mode returns. Test voices are never used.

    python -m training.kws_calibrate runs/kws_soup4 --false-accept 0.0553 --out runs/kws_soup4_cal

The output is a run directory like the input's (the calibrated checkpoint in `model/`, a
`summary.json` whose results are recomputed on it plus "calibration": the chosen bias, the
target and the valid figures before and after, the input's curves), ready for `dlr-eval` and
`kws_card`; `calibration.png` plots the valid sweep. The operating point must be chosen again
(`dlr-eval speech --write-operating-point`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlr_runtime import DLRModel, load_checkpoint
from training.cli import parse_tool_args, recipe_from_summary, tool_command, tool_parser
from training.data.sc12 import SIL, UNK
from training.recipes.kws import last_frame_scores
from training.trainer import MODEL_DIR

BIASES = tuple(float(b) for b in np.round(np.arange(0.0, 4.0001, 0.05), 2))


@dataclass(frozen=True)
class ValidPoint:
    """Valid-clip figures of one `_unknown_` bias."""

    unknown_bias: float
    false_accept: float  # non-command clips (unknown words, word-less windows) called a command
    command_accuracy: float  # command clips given their own label


def sweep(scores: torch.Tensor, labels: torch.Tensor, biases: Sequence[float]) -> list[ValidPoint]:
    """Scores (N, C) and labels (N,) of the valid clips -> one point per bias."""
    is_cmd = labels < SIL
    out = []
    for b in biases:
        shifted = scores.clone()
        shifted[:, UNK] += b
        pred = shifted.argmax(-1)
        out.append(
            ValidPoint(
                unknown_bias=b,
                false_accept=float((pred[~is_cmd] < SIL).float().mean()),
                command_accuracy=float((pred[is_cmd] == labels[is_cmd]).float().mean()),
            )
        )
    return out


def choose(points: Sequence[ValidPoint], target: float) -> ValidPoint:
    """The smallest bias within `target` false accepts (ValueError if none reaches it)."""
    for p in sorted(points, key=lambda p: p.unknown_bias):
        if p.false_accept <= target:
            return p
    best = min(p.false_accept for p in points)
    raise ValueError(
        f"no bias up to {max(p.unknown_bias for p in points)} brings the valid false accepts "
        f"to {target} (lowest: {best:.4f})"
    )


def plot_sweep(points: Sequence[ValidPoint], chosen: ValidPoint, target: float, path: Path) -> None:
    """The valid trade-off as a PNG: commands kept against non-command clips accepted, one
    point per bias, the target and the chosen bias marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    fa = [100 * p.false_accept for p in points]
    ca = [100 * p.command_accuracy for p in points]
    ax.plot(fa, ca, marker=".", lw=1, label="valid clips, one point per bias")
    ax.axvline(100 * target, color="grey", ls="--", lw=1, label=f"target {100 * target:g} %")
    ax.plot(
        [100 * chosen.false_accept], [100 * chosen.command_accuracy], "o", color="C3",
        label=f"chosen: bias {chosen.unknown_bias:g}",
    )  # fmt: skip
    ax.plot(
        [100 * points[0].false_accept], [100 * points[0].command_accuracy], "s", color="C2",
        label="no bias",
    )  # fmt: skip
    ax.set_xlabel("non-command clips accepted as a command (%)")
    ax.set_ylabel("commands given their label (%)")
    ax.set_title("_unknown_ bias: rejection vs commands (valid clips)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def with_unknown_bias(model: DLRModel, bias: float) -> DLRModel:
    """`model` with `bias` added to its `_unknown_` logit (in place; returned): to every class of
    a union head (dlr_runtime/unknown_head.py), which adds it to their logsumexp."""
    with torch.no_grad():
        model.head.proj.bias[UNK:] += bias  # (UNK is the last label: its row, or its classes)
    return model


def calibrate(run: Path, out: Path, target: float, command: str = "") -> dict[str, Any]:
    """Calibrate the run directory `run` into `out`; returns the new summary."""
    summary = json.loads((run / "summary.json").read_text())
    if summary.get("recipe") != "kws":
        raise ValueError(f"{run} is a {summary.get('recipe')!r} run, not a kws run")
    if not 0.0 <= target < 1.0:
        raise ValueError(f"--false-accept must be in [0, 1), got {target}")
    model = load_checkpoint(run / MODEL_DIR)
    if not isinstance(model, DLRModel):
        raise ValueError(f"{run / MODEL_DIR} is not a training-form checkpoint")
    recipe = recipe_from_summary(summary)
    scores = last_frame_scores(model, recipe.valid_audio)  # (N, C)
    points = sweep(scores, recipe.valid_labels, BIASES)
    chosen = choose(points, target)
    with_unknown_bias(model, chosen.unknown_bias)
    out.mkdir(parents=True, exist_ok=True)
    results = recipe.finish(model, torch.device("cpu"), out)
    new = {
        **summary,
        **results,
        "command": command,
        "train": {**summary["train"], "out_dir": str(out)},
        "calibration": {
            "source": str(run),
            "source_command": summary.get("command"),
            "false_accept_target": target,
            "before": asdict(points[0]),
            "chosen": asdict(chosen),
            "sweep": [asdict(p) for p in points],
        },
    }
    recipe.save_model(model, out / MODEL_DIR, new)
    (out / "summary.json").write_text(json.dumps(new, indent=1, default=str))
    plot_sweep(points, chosen, target, out / "calibration.png")
    for name in ("curves.png", "metrics.csv"):
        if (run / name).is_file():
            shutil.copy2(run / name, out / name)
    return new


def main(argv: Sequence[str] | None = None) -> None:
    p = tool_parser(__doc__)
    p.add_argument("run", type=Path, help="a finished kws run directory (dlr-train or soup)")
    p.add_argument("--out", type=Path, required=True, help="the calibrated run directory")
    p.add_argument(
        "--false-accept",
        type=float,
        required=True,
        help="most valid non-command clips called a command by argmax (a fraction)",
    )
    args = parse_tool_args(p, argv)
    command = tool_command("training.kws_calibrate", argv)
    try:
        new = calibrate(args.run, args.out, args.false_accept, command)
    except (ValueError, FileNotFoundError) as e:
        p.exit(2, f"error: {e}\n")
    print(json.dumps(new["calibration"]["chosen"]))


if __name__ == "__main__":
    main()
