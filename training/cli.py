"""`dlr-train`: the training command line, one subcommand per recipe.

    dlr-train speech --out-dir runs/speech --epochs 30 --frame-stride 80
    dlr-train lm --text my_corpus/ --out-dir runs/lm --steps 3000 --arch dlr
    dlr-train synthetic --task cumsum --length 256 --steps 500
    dlr-train suite --length 128 --steps 300 --out-dir benchmarks/synthetic
    torchrun --nproc_per_node=2 -m training.cli lm ...      (DistributedDataParallel)

Every option of `TrainConfig` (optimisation, schedule, device, checkpoints) and of
`ModelOptions` (width, state size, layers, layer kind) is available to every recipe, under the
dataclass field name with dashes (`--d-model`, `--ssm-lr`, `--no-amp`...); recipe options follow.
Help texts come from the field comments of those dataclasses.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import inspect
import json
import re
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from training.config import TrainConfig
from training.modelopts import ModelOptions

ALIASES = {"d_model": ["--width"], "d_state": ["--state-size"], "n_layers": ["--layers"]}


def _field_help(cls: type) -> dict[str, str]:
    """Map each dataclass field to the comment on its line in the class source."""
    helps = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+): [^=]+=.*?#\s*(.*)$", line)
        if m:
            helps[m.group(1)] = m.group(2).replace("%", "%%")
    return helps


def add_dataclass_args(
    parser: argparse.ArgumentParser, cls: type, title: str, **defaults: Any
) -> None:
    """One option per field of dataclass `cls` (defaults overridable per recipe)."""
    group = parser.add_argument_group(title)
    helps = _field_help(cls)
    for f in dataclasses.fields(cls):
        default = defaults.get(f.name, f.default if f.default is not dataclasses.MISSING else None)
        flags = [f"--{f.name.replace('_', '-')}", *ALIASES.get(f.name, [])]
        kw: dict[str, Any] = {"dest": f.name, "default": default, "help": helps.get(f.name, "")}
        if isinstance(default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        elif isinstance(default, tuple) and not default:
            kw.update(nargs="*", type=str)
        elif isinstance(default, tuple):
            kw.update(nargs=len(default), type=type(default[0]))
        elif default is not None:
            kw["type"] = type(default)
        kw["help"] += " (default: %(default)s)"
        group.add_argument(*flags, **kw)


def pick(cls: type, args: argparse.Namespace) -> Any:
    """Build dataclass `cls` from the parsed options that belong to it."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
    for name, value in values.items():
        if isinstance(value, list):
            values[name] = tuple(value)
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class RecipeSpec:
    """A recipe subcommand: where its classes live and its default options."""

    module: str  # module holding the options dataclass and the recipe class
    options: str  # name of the recipe's options dataclass
    recipe: str  # name of the Recipe subclass, constructed as (options, model, train)
    help: str  # one-line help of the subcommand
    train: dict[str, Any]  # TrainConfig defaults of this recipe
    model: dict[str, Any]  # ModelOptions defaults of this recipe


RECIPES: dict[str, RecipeSpec] = {
    "speech": RecipeSpec(
        "training.recipes.speech",
        "SpeechOptions",
        "SpeechRecipe",
        "SC10 keywords from raw 16 kHz audio (synthetic espeak-ng voices or a local copy)",
        {
            "out_dir": "runs/speech",
            "epochs": 30,
            "batch_size": 32,
            "lr": 3e-3,
            "ssm_lr": 1e-3,
            "warmup": 200,
            "save_every": 100,
        },
        {"d_model": 128, "d_state": 64, "n_layers": 4, "dropout": 0.1},
    ),
    "kws": RecipeSpec(
        "training.recipes.kws",
        "KWSOptions",
        "KWSRecipe",
        "SC12 keyword spotting for continuous streams (espeak-ng + flite + festival voices)",
        {
            "out_dir": "runs/kws",
            "epochs": 20,
            "batch_size": 32,
            "lr": 3e-3,
            "ssm_lr": 1e-3,
            "warmup": 200,
            "save_every": 200,
            "threads": 1,
        },
        {
            "d_model": 128,
            "d_state": 64,
            "n_layers": 4,
            "dropout": 0.1,
            "dt_min": 0.01,
            "dt_max": 0.5,
        },
    ),
    "lm": RecipeSpec(
        "training.recipes.lm",
        "LMOptions",
        "LMRecipe",
        "byte-level language model (DLR or the Transformer baseline)",
        {
            "out_dir": "runs/lm",
            "epochs": 10,
            "batch_size": 16,
            "lr": 2e-3,
            "ssm_lr": 1e-3,
            "warmup": 100,
            "weight_decay": 0.1,
            "steps_per_epoch": 200,
        },
        {"d_model": 256, "d_state": 64, "n_layers": 4},
    ),
    "synthetic": RecipeSpec(
        "training.recipes.synthetic",
        "SyntheticOptions",
        "SyntheticRecipe",
        "one task of the paper's synthetic suite (DLR or the attention baseline)",
        {
            "out_dir": "runs/synthetic",
            "epochs": 5,
            "batch_size": 32,
            "lr": 3e-3,
            "ssm_lr": 1e-3,
            "warmup": 50,
            "steps_per_epoch": 100,
            "weight_decay": 0.0,
            "save_every": 0,
        },
        {"d_model": 64, "d_state": 128, "n_layers": 2},
    ),
}


def _add_recipe(sub: argparse._SubParsersAction, name: str, spec: RecipeSpec) -> None:
    module = importlib.import_module(spec.module)
    p = sub.add_parser(name, help=spec.help)
    add_dataclass_args(p, TrainConfig, "training", **spec.train)
    add_dataclass_args(p, ModelOptions, "model", **spec.model)
    add_dataclass_args(p, getattr(module, spec.options), f"{name} options")
    p.set_defaults(run=functools.partial(_run_recipe, spec))


def _run_recipe(spec: RecipeSpec, args: argparse.Namespace) -> dict:
    from training.trainer import Trainer

    module = importlib.import_module(spec.module)
    cfg = pick(TrainConfig, args)
    options = pick(getattr(module, spec.options), args)
    recipe = getattr(module, spec.recipe)(options, pick(ModelOptions, args), cfg)
    return Trainer(recipe, cfg, command=args.command).run()


def _suite(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("suite", help="every synthetic task for DLR and attention: table + plot")
    add_dataclass_args(
        p,
        TrainConfig,
        "training (per task and architecture)",
        out_dir="benchmarks/synthetic",
        steps=300,
        batch_size=32,
        lr=3e-3,
        ssm_lr=1e-3,
        warmup=30,
        weight_decay=0.0,
        save_every=0,
        progress=False,
        log_every=25,
    )
    add_dataclass_args(
        p,
        ModelOptions,
        "model (width and layers apply to both)",
        d_model=64,
        d_state=128,
        n_layers=2,
    )
    g = p.add_argument_group("suite")
    g.add_argument("--length", type=int, default=64, help="sequence length L of every task")
    g.add_argument("--tasks", nargs="*", default=[], help="tasks to run (default: all)")
    g.add_argument("--archs", nargs="*", default=["dlr", "attention"], help="dlr and/or attention")
    g.add_argument("--heldout-batches", type=int, default=4, help="held-out batches per score")
    g.add_argument("--work-dir", default="runs/suite", help="per-run directories")
    p.set_defaults(run=_run_suite)


def _run_suite(args: argparse.Namespace) -> dict:
    from pathlib import Path

    from training.data.synthetic import TASKS
    from training.suite import run_suite

    cfg = pick(TrainConfig, args)
    if cfg.steps < 1:
        raise ValueError("suite: --steps must be >= 1")
    rows = run_suite(
        list(args.tasks) or list(TASKS),
        args.length,
        cfg,
        pick(ModelOptions, args),
        Path(cfg.out_dir),
        Path(args.work_dir),
        tuple(args.archs),
        args.heldout_batches,
        args.command,
    )
    print((Path(cfg.out_dir) / "results.md").read_text())
    return {"rows": len(rows)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlr-train",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="recipe", required=True, metavar="RECIPE")
    for name, spec in RECIPES.items():
        _add_recipe(sub, name, spec)
    _suite(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command = shlex.join(["dlr-train", *argv])
    try:
        summary = args.run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"dlr-train {args.recipe}: error: {e}", file=sys.stderr)
        return 2
    if summary:
        brief = {
            k: v for k, v in summary.items() if k not in ("history", "train", "recipe_options")
        }
        print(json.dumps(brief, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
