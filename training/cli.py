"""`dlr-train`: the training command line, one subcommand per recipe.

    dlr-train speech --out-dir runs/speech --epochs 30 --frame-stride 80
    dlr-train lm --text my_corpus/ --out-dir runs/lm --steps 3000 --arch dlr
    dlr-train synthetic --task cumsum --length 256 --steps 500
    dlr-train suite --length 128 --steps 300 --out-dir benchmarks/synthetic
    torchrun --nproc_per_node=2 -m training.cli lm ...      (data parallel, training/distributed.py)

Every option of `TrainConfig` (optimisation, schedule, device, checkpoints) and of
`ModelOptions` (width, state size, layers, layer kind) is available to every recipe, under the
dataclass field name with dashes (`--d-model`, `--ssm-lr`, `--no-amp`...); recipe options follow.
The command line is built by tyro from those dataclasses: their field comments are the help.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Union

import tyro

from training.config import TrainConfig
from training.modelopts import ModelOptions

# One flat flag namespace: `--epochs`, not `--train.epochs` (field names never collide).
FLAT = (tyro.conf.OmitArgPrefixes, tyro.conf.OmitSubcommandPrefixes)


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


def tool_parser(doc: str) -> argparse.ArgumentParser:
    """The parser of a `python -m training.<tool>`: the first line of `doc` as its
    description, and `--threads` (read by `parse_tool_args`)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    return p


def parse_tool_args(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse `argv` and apply `--threads`."""
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return args


def tool_command(module: str, argv: Sequence[str] | None) -> str:
    """The command line of `python -m module` run with `argv` (None: this process's), quoted,
    for a run's records."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def recipe_from_summary(summary: dict[str, Any]) -> Any:
    """The recipe of a finished run, rebuilt from the options its summary.json recorded
    (`Recipe.describe` and the run's TrainConfig) and set up (data loaded, seeded as the
    run was) on one CPU process: ready for `evaluate`, `finish` and `save_model`."""
    import torch

    from training.distributed import DistContext

    name = summary["recipe"]
    spec = RECIPES[name]
    module = importlib.import_module(spec.module)
    options = summary["recipe_options"]
    opts = getattr(module, spec.options)(**options[name])
    train = TrainConfig.from_dict(summary["train"])
    recipe = getattr(module, spec.recipe)(opts, ModelOptions(**options["model"]), train)
    torch.manual_seed(train.seed)
    recipe.setup(DistContext())
    return recipe


@dataclasses.dataclass
class SuiteOptions:
    length: int = 64  # sequence length L of every task
    tasks: tuple[str, ...] = ()  # tasks to run (default: all)
    archs: tuple[str, ...] = ("dlr", "attention")  # dlr and/or attention
    heldout_batches: int = 4  # held-out batches scored per task
    work_dir: str = "runs/suite"  # per-run directories


@dataclasses.dataclass
class SuiteArgs:
    """Every synthetic task for DLR and attention: table + plot."""

    train: TrainConfig
    model: ModelOptions
    suite: SuiteOptions


SUITE_DEFAULT = SuiteArgs(
    TrainConfig(
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
    ),
    ModelOptions(d_model=64, d_state=128, n_layers=2),
    SuiteOptions(),
)


def _recipe_type(name: str, spec: RecipeSpec) -> Any:
    """The subcommand of one recipe: a dataclass (train, model, <recipe> options) + defaults."""
    options_cls = getattr(importlib.import_module(spec.module), spec.options)
    cls = dataclasses.make_dataclass(
        f"{options_cls.__name__}Args",
        [
            ("train", TrainConfig),
            ("model", ModelOptions),
            ("options", Annotated[options_cls, tyro.conf.arg(name=name)]),
            ("recipe", Annotated[str, tyro.conf.Suppress], dataclasses.field(default=name)),
        ],
    )
    default = cls(TrainConfig(**spec.train), ModelOptions(**spec.model), options_cls())
    return Annotated[cls, tyro.conf.subcommand(name, default=default, description=spec.help)]


def _commands() -> Any:
    kinds = [_recipe_type(name, spec) for name, spec in RECIPES.items()]
    suite = Annotated[SuiteArgs, tyro.conf.subcommand("suite", default=SUITE_DEFAULT)]
    return Union[tuple([*kinds, suite])]  # noqa: UP007 (a runtime-built union)


def parse(argv: Sequence[str]) -> Any:
    """The parsed subcommand: a recipe's args dataclass or `SuiteArgs` (exits 2 on bad flags)."""
    return tyro.cli(
        _commands(),
        args=list(argv),
        prog="dlr-train",
        description=__doc__.splitlines()[0],
        config=FLAT,
    )


def _run_recipe(args: Any, command: str) -> dict:
    """Train one recipe; `args` is the dataclass `_recipe_type` built for it."""
    from training.trainer import Trainer

    spec = RECIPES[args.recipe]
    recipe_cls = getattr(importlib.import_module(spec.module), spec.recipe)
    recipe = recipe_cls(args.options, args.model, args.train)
    return Trainer(recipe, args.train, command=command).run()


def _run_suite(args: SuiteArgs, command: str) -> dict:
    from training.data.synthetic import TASKS
    from training.suite import run_suite

    cfg = args.train
    if cfg.steps < 1:
        raise ValueError("suite: --steps must be >= 1")
    rows = run_suite(
        list(args.suite.tasks) or list(TASKS),
        args.suite.length,
        cfg,
        args.model,
        Path(cfg.out_dir),
        Path(args.suite.work_dir),
        tuple(args.suite.archs),
        args.suite.heldout_batches,
        command,
    )
    print((Path(cfg.out_dir) / "results.md").read_text())
    return {"rows": len(rows)}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    command = shlex.join(["dlr-train", *argv])
    name = "suite" if isinstance(args, SuiteArgs) else args.recipe
    try:
        summary = _run_suite(args, command) if name == "suite" else _run_recipe(args, command)
    except (ValueError, FileNotFoundError) as e:
        print(f"dlr-train {name}: error: {e}", file=sys.stderr)
        return 2
    if summary:
        brief = {
            k: v for k, v in summary.items() if k not in ("history", "train", "recipe_options")
        }
        print(json.dumps(brief, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
