"""Cap how long a trained model's modes remember: every mode slower than `--cap-s` seconds made
that slow, the others left exactly as they are.

A DLR mode forgets as |lambda|^t; its time constant is tau = -frame / ln|lambda| seconds. A
speech model trained on 2.4 s windows can learn modes that remember for minutes (an integrator
is harmless within a window), and a live stream then drives them where training never went:
the speech card measures clips scored after 60 s of stream falling far below the same clips
from a fresh state. Lowering those modes' |lambda| to exp(-frame / cap) bounds the memory of
every layer without retraining; it changes the outputs only through the modes it touches.

    python -m training.cap_memory runs/m21_se_final --cap-s 2 --out runs/m22_se_cap2

The input is a `dlr-train` run directory (its `summary.json` and `model/`, or with
`--checkpoint last|ema` that checkpoint). The output is a run directory like a training
run's, so `dlr-eval` and the model cards read it unchanged: `model/` (its metadata the
recipe's, with a fresh default operating point: choose it with `dlr-eval speech
--write-operating-point`), `summary.json` (the recipe's final results recomputed on the capped
model, the run's steps and time, and "memory_cap": the source, the cap and how many modes it
moved), and the run's own `metrics.csv` and `curves.png`.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dlr_runtime import load_checkpoint
from dlr_runtime.model import DLRModel
from dlr_runtime.ssm import DLRLayer
from training.cli import parse_tool_args, recipe_from_summary, tool_command, tool_parser
from training.trainer import CHECKPOINTS, MODEL_DIR, hardware


@torch.no_grad()
def time_constants(model: DLRModel) -> torch.Tensor:
    """Every mode's time constant in seconds (L * H' * N,), float64."""
    frame_s = model.config.frame_stride / model.config.sample_rate
    logs = [blk.ssm.recurrent_params().log_lam.real.flatten() for blk in model.blocks]
    return -frame_s / torch.cat(logs)  # ln |lambda| < 0


def cap_memory(model: DLRModel, cap_s: float) -> tuple[DLRModel, int]:
    """A copy of `model` whose modes remember at most `cap_s` seconds; and how many moved."""
    if cap_s <= 0:
        raise ValueError(f"the cap must be positive seconds, got {cap_s}")
    if model.config.encoder != "audio":
        raise ValueError("the memory cap is for audio models (time constants in seconds)")
    out = copy.deepcopy(model)
    frame_s = out.config.frame_stride / out.config.sample_rate
    moved = 0
    for blk in out.blocks:
        ssm = blk.ssm
        if not isinstance(ssm, DLRLayer):
            raise ValueError("the memory cap needs the dlr layer (Re Lambda = -(p^2 + floor))")
        least = frame_s / cap_s - ssm.min_decay  # p^2 at least this: -Re Lambda >= frame / cap
        if least <= 0:
            continue
        slow = ssm.p.detach().double() ** 2 < least
        moved += int(slow.sum())
        with torch.no_grad():
            ssm.p.copy_(torch.where(slow, math.sqrt(least), ssm.p.double()).to(ssm.p.dtype))
    return out, moved


def cap_run(run: Path, out: Path, cap_s: float, checkpoint: str, command: str) -> dict[str, Any]:
    """Cap `run`'s `checkpoint` into the run directory `out`; returns its summary."""
    source = json.loads((run / "summary.json").read_text())
    model = load_checkpoint(run / checkpoint)
    if not isinstance(model, DLRModel):
        raise ValueError(f"{run / checkpoint} is not in training form")
    before = time_constants(model)
    capped, moved = cap_memory(model.eval(), cap_s)
    recipe = recipe_from_summary(source)
    out.mkdir(parents=True, exist_ok=True)
    results = recipe.finish(capped, torch.device("cpu"), out)
    summary: dict[str, Any] = {
        "command": command,
        "recipe": source["recipe"],
        "recipe_options": source["recipe_options"],
        "train": {**source["train"], "out_dir": str(out)},
        "memory_cap": {
            "run": str(run),
            "checkpoint": checkpoint,
            "cap_s": cap_s,
            "modes": int(before.numel()),
            "modes_capped": moved,
            "longest_before_s": float(before.max()),
            "longest_after_s": float(time_constants(capped).max()),
        },
        "steps": source.get("steps"),
        "train_time_s": source.get("train_time_s"),
        "parameters": sum(p.numel() for p in capped.parameters()),
        "hardware": hardware(),
        **results,
    }
    recipe.save_model(capped, out / MODEL_DIR, summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for name in ("metrics.csv", "curves.png"):
        if (run / name).is_file():
            shutil.copyfile(run / name, out / name)
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    p = tool_parser(__doc__)
    p.add_argument("run", type=Path, help="a dlr-train run directory")
    p.add_argument("--out", type=Path, required=True, help="the capped model's run directory")
    p.add_argument("--cap-s", type=float, required=True, help="longest memory, in seconds")
    p.add_argument("--checkpoint", choices=CHECKPOINTS, default=MODEL_DIR)
    args = parse_tool_args(p, argv)
    try:
        summary = cap_run(
            args.run,
            args.out,
            args.cap_s,
            args.checkpoint,
            tool_command("training.cap_memory", argv),
        )
    except (ValueError, FileNotFoundError) as e:
        p.exit(2, f"error: {e}\n")
    print(json.dumps({"out": str(args.out), "memory_cap": summary["memory_cap"]}, indent=1))


if __name__ == "__main__":
    main()
