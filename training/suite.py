"""The synthetic task suite: every task for DLR and for the attention baseline at one length.

`dlr-train suite --length 64 --steps 300 --out-dir benchmarks/synthetic` trains one small model
per (task, architecture) with the same budget (steps, batch, lr), scores it on held-out batches
(R^2, 1 = perfect), and writes `results.md` (a markdown table), `results.json` and
`scores.png` (grouped bars per task) into the output directory. Per-run directories
(checkpoints, metrics) go to `--work-dir`.

Expected picture (the paper's finding): DLR is near-perfect on tasks that are a few fixed
kernels (shift, cumsum) and weak on context-dependent ones (reverse, sort, context_shift,
masked_select, solve), which attention handles at short lengths.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from training.config import TrainConfig
from training.data.synthetic import TASKS
from training.modelopts import ModelOptions
from training.recipes.synthetic import SyntheticOptions, SyntheticRecipe
from training.trainer import Trainer

ARCHS = ("dlr", "attention")


def run_suite(
    tasks: list[str],
    length: int,
    train: TrainConfig,
    model: ModelOptions,
    out_dir: Path,
    work_dir: Path,
    archs: tuple[str, ...] = ARCHS,
    heldout_batches: int = 4,
    command: str = "",
) -> list[dict[str, Any]]:
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ValueError(f"unknown tasks {unknown}; expected some of {sorted(TASKS)}")
    rows = []
    for task in tasks:
        for arch in archs:
            cfg = replace(
                train,
                out_dir=str(work_dir / f"{task}-{arch}"),
                epochs=1,
                steps_per_epoch=train.steps,
                resume=False,
            )
            opts = SyntheticOptions(
                task=task, length=length, arch=arch, heldout_batches=heldout_batches
            )
            recipe = SyntheticRecipe(opts, model, cfg)
            t0 = time.perf_counter()
            summary = Trainer(recipe, cfg).run()
            row = {
                "task": task,
                "arch": arch,
                "score": summary["test"]["score"],
                "mse": summary["test"]["loss"],
                "parameters": summary["parameters"],
                "seconds": round(time.perf_counter() - t0, 1),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "length": length,
        "command": command,
        "train": train.to_dict(),
        "model": model.to_dict(),
    }
    (out_dir / "results.json").write_text(json.dumps({"setup": meta, "rows": rows}, indent=1))
    table = markdown_table(rows, length, train, model)
    if command:
        table += f"\nCommand:\n\n```\n{command}\n```\n"
    (out_dir / "results.md").write_text(table)
    plot_scores(rows, out_dir / "scores.png", length)
    return rows


def markdown_table(
    rows: list[dict[str, Any]], length: int, train: TrainConfig, model: ModelOptions
) -> str:
    archs = [a for a in ARCHS if any(r["arch"] == a for r in rows)]
    by = {(r["task"], r["arch"]): r for r in rows}
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    params = {a: next(r["parameters"] for r in rows if r["arch"] == a) for a in archs}
    lines = [
        f"# Synthetic task suite at length {length}",
        "",
        f"Held-out score (R^2 on scored positions, 1 = perfect, 0 = predicting the mean) after "
        f"{train.steps} steps of batch {train.batch_size} (lr {train.lr}, SSM lr {train.ssm_lr}), "
        f"width {model.d_model}, {model.n_layers} layers, DLR state size {model.d_state}.",
        "Parameters: " + ", ".join(f"{a} {params[a]:,}" for a in archs) + ".",
        "",
        "| task | " + " | ".join(archs) + " |",
        "|---|" + "---:|" * len(archs),
    ]
    for task in tasks:
        cells = [f"{by[(task, a)]['score']:.3f}" if (task, a) in by else "-" for a in archs]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_scores(rows: list[dict[str, Any]], path: Path, length: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    archs = [a for a in ARCHS if any(r["arch"] == a for r in rows)]
    by = {(r["task"], r["arch"]): r["score"] for r in rows}
    width = 0.8 / len(archs)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(tasks) + 2), 4))
    for i, arch in enumerate(archs):
        xs = [t + (i - (len(archs) - 1) / 2) * width for t in range(len(tasks))]
        ax.bar(xs, [by.get((task, arch), 0.0) for task in tasks], width, label=arch)
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels(tasks, rotation=35, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out score (R^2)")
    ax.set_title(f"synthetic suite, length {length}")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
