"""Weight averaging of fine-tuned runs: a "model soup" (Wortsman et al., ICML 2022).

Runs fine-tuned from the same weights stay in one basin of the loss, so the mean of their
weights is a model of its own, at the cost of one: no ensemble to run at inference. Averaging
fine-tunes with different augmentation (morphs, masks, seeds) often generalises better to
unseen data than any one of them; `models/speech-commands/MODEL.md` measures it.

    python -m training.soup --out runs/kws_soup runs/kws_a runs/kws_b runs/kws_c

Each input is a run directory of `dlr-train` (its `summary.json` and best `model/`, with
`--checkpoint last` its last step's `last/`, or with `--checkpoint ema` the weight average of
a run trained with `--ema-decay`). The contract, checked before anything is written:
- at least two runs, one recipe, one model config (same shapes and task fields);
- one common starting point: every run was fine-tuned (`--init-from`) from the same weights,
  since weights of independently initialised runs do not average into a working model;
- the checkpoints are in training form (what `dlr-train` writes).

`--with-start` also averages in the starting point itself (the runs' `--init-from` checkpoint
as it is at averaging time), one member among the others; then one run is enough.

`--start DIR` names that starting point instead, for runs whose `--init-from` paths differ or
have since been overwritten (e.g. fine-tunes of a model that was shipped as
`models/speech-commands` and later replaced, beside fine-tunes of its copy restored from
git). The caller vouches that every run started from DIR's weights: the soup records DIR and
each run's own `init_from`, but cannot check weights the runs did not keep.

The soup is the plain mean of every floating-point tensor (accumulated in float64, stored in
the ingredients' dtype); any other tensor must be equal across runs. The output is a run
directory like a training run's, so `dlr-eval` and the model cards read it unchanged:
`model/` (the checkpoint; its metadata is the recipe's, with a fresh default operating point:
choose it with `dlr-eval speech --write-operating-point`), `summary.json` (the recipe's final
results recomputed on the soup: held-out metrics, streaming exactness, state size; plus
"soup": each ingredient's command, steps and time), `metrics.csv` and `curves.png` (the
ingredients' held-out curves, with the soup's held-out score as a line).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlr_runtime import CheckpointError, DLRModel, load_checkpoint, read_header
from training.cli import parse_tool_args, recipe_from_summary, tool_command, tool_parser
from training.metrics import write_csv
from training.trainer import CHECKPOINTS, MODEL_DIR, hardware


class SoupError(ValueError):
    """The runs cannot be averaged (the message says which run and why)."""


@dataclass(frozen=True)
class Ingredient:
    """One fine-tuned run: its directory and its training summary."""

    run: Path
    summary: dict[str, Any]
    header: dict[str, Any]  # the checkpoint's config.json, as `read_header` returns it
    checkpoint: str = MODEL_DIR  # which of the run's checkpoints: "model" (best) or "last"

    @property
    def model_dir(self) -> Path:
        return self.run / self.checkpoint

    @property
    def init_from(self) -> str:
        return str(self.summary.get("train", {}).get("init_from") or "")

    def record(self) -> dict[str, Any]:
        """What the soup's summary keeps of this run."""
        s = self.summary
        return {
            "run": str(self.run),
            "checkpoint": self.checkpoint,
            "init_from": self.init_from,
            "command": s.get("command"),
            "steps": s.get("steps"),
            "train_time_s": s.get("train_time_s"),
            "best_valid": s.get("best_valid"),
            "recipe_options": s.get("recipe_options"),
        }


def read_ingredient(run: Path, checkpoint: str = MODEL_DIR) -> Ingredient:
    if checkpoint not in CHECKPOINTS:
        raise SoupError(f"unknown checkpoint {checkpoint!r}; expected one of {CHECKPOINTS}")
    summary_path = run / "summary.json"
    if not summary_path.is_file():
        raise SoupError(f"{run} is not a finished dlr-train run: no summary.json")
    if not (run / checkpoint / "config.json").is_file():
        raise SoupError(f"{run} has no {checkpoint}/config.json")
    try:
        header = read_header(run / checkpoint)
    except CheckpointError as e:
        raise SoupError(f"{run}: {e}") from e
    try:
        summary = json.loads(summary_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SoupError(f"{summary_path} is not valid JSON: {e}") from e
    if not isinstance(summary, dict) or "recipe" not in summary:
        raise SoupError(f"{summary_path} is not a dlr-train summary (no 'recipe')")
    return Ingredient(run, summary, header, checkpoint)


def check_ingredients(
    items: Sequence[Ingredient], with_start: bool = False, start: Path | None = None
) -> None:
    """Raise SoupError unless `items` can be averaged (the module docstring's contract); with
    their starting point averaged in, one run is enough; with `start` named, their own
    `init_from` paths may differ."""
    need = 1 if with_start else 2
    if len(items) < need:
        raise SoupError(f"a soup needs at least {need} run(s), got {len(items)}")
    first = items[0]
    for item in items:
        header = item.header
        if header["form"] != "train":
            raise SoupError(f"{item.model_dir} is a {header['form']} checkpoint, not training form")
        if item.summary.get("recipe") != first.summary.get("recipe"):
            raise SoupError(
                f"{item.run} is a {item.summary.get('recipe')!r} run, "
                f"{first.run} a {first.summary.get('recipe')!r} run"
            )
        if header["config"] != first.header["config"]:
            raise SoupError(f"{item.run}'s model config differs from {first.run}'s")
        if not item.init_from:
            raise SoupError(f"{item.run} was trained from scratch: a soup averages fine-tunes")
        if start is None and Path(item.init_from).resolve() != Path(first.init_from).resolve():
            raise SoupError(
                f"{item.run} started from {item.init_from}, {first.run} from {first.init_from}: "
                "a soup averages fine-tunes of the same weights"
            )
    if start is not None:
        start_path(items, start)  # named: it must exist and fit, averaged in or not


def average_state(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of state dicts with the same keys and shapes: floating-point tensors averaged
    in float64 (returned in their own dtype), any other tensor required to be equal."""
    out: dict[str, torch.Tensor] = {}
    for name, ref in states[0].items():
        group = [s[name] for s in states]
        if any(t.shape != ref.shape for t in group):
            raise SoupError(f"tensor {name!r} has different shapes across runs")
        if ref.is_floating_point():
            out[name] = (sum(t.double() for t in group) / len(group)).to(ref.dtype)
        elif all(torch.equal(t, ref) for t in group):
            out[name] = ref.clone()
        else:
            raise SoupError(f"tensor {name!r} is not floating point and differs across runs")
    return out


def start_path(items: Sequence[Ingredient], start: Path | None = None) -> Path:
    """The runs' starting point (`start`, or else their common `--init-from` as it is now),
    checked to be a training checkpoint of their config (SoupError otherwise)."""
    path = start if start is not None else Path(items[0].init_from)
    try:
        header = read_header(path)
    except CheckpointError as e:
        raise SoupError(f"the runs' starting point: {e}") from e
    if header["form"] != "train" or header["config"] != items[0].header["config"]:
        raise SoupError(
            f"the runs' starting point {path} is not a training checkpoint of their config"
        )
    return path


def start_model(items: Sequence[Ingredient], start: Path | None = None) -> DLRModel:
    """The weights the runs were fine-tuned from (`start_path`)."""
    model = load_checkpoint(start_path(items, start))
    assert isinstance(model, DLRModel)
    return model


def soup_model(
    items: Sequence[Ingredient], with_start: bool = False, start: Path | None = None
) -> DLRModel:
    """The averaged network (eval mode) of runs that passed `check_ingredients`; with
    `with_start`, their starting point is averaged in as one more member (as in WiSE-FT,
    Wortsman et al., CVPR 2022, which interpolates a model and its fine-tune)."""
    models = [load_checkpoint(i.model_dir) for i in items]
    if with_start:
        models.append(start_model(items, start))
    soup = models[0]
    assert isinstance(soup, DLRModel)
    soup.load_state_dict(average_state([m.state_dict() for m in models]))
    return soup.eval()


def make_soup(
    runs: Sequence[Path],
    out: Path,
    command: str = "",
    with_start: bool = False,
    checkpoint: str = MODEL_DIR,
    start: Path | None = None,
) -> dict[str, Any]:
    """Average `runs`' `checkpoint` (and, `with_start`, their starting point: `start` or
    their common `--init-from`) into the run directory `out`; returns its summary."""
    items = [read_ingredient(Path(r), checkpoint) for r in runs]
    check_ingredients(items, with_start, start)
    model = soup_model(items, with_start, start)
    recipe = recipe_from_summary(items[0].summary)
    out.mkdir(parents=True, exist_ok=True)
    results = recipe.finish(model, torch.device("cpu"), out)
    first = items[0].summary
    summary: dict[str, Any] = {
        "command": command,
        "recipe": first["recipe"],
        "recipe_options": first["recipe_options"],
        "train": {**first["train"], "out_dir": str(out)},
        "soup": {
            "init_from": str(start) if start is not None else items[0].init_from,
            "with_start": with_start,
            "ingredients": [i.record() for i in items],
        },
        "steps": sum(int(i.summary.get("steps") or 0) for i in items),
        "train_time_s": round(sum(float(i.summary.get("train_time_s") or 0) for i in items), 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "hardware": hardware(),
        **results,
    }
    recipe.save_model(model, out / MODEL_DIR, summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    _write_curves(items, summary, recipe.primary, out)
    return summary


def _write_curves(
    items: Sequence[Ingredient], summary: dict[str, Any], primary: str, out: Path
) -> None:
    """metrics.csv: every ingredient's held-out records (column "run"); curves.png: the
    ingredients' held-out `primary` by step and the soup's as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = []
    for item in items:
        for r in item.summary.get("history", []):
            if r.get("kind") == "eval":
                records.append({"run": item.run.name, **r})
    if records:
        write_csv(records, out / "metrics.csv")
    fig, ax = plt.subplots(figsize=(7, 4))
    for item in items:
        pts = [r for r in records if r["run"] == item.run.name and primary in r]
        ax.plot([r["step"] for r in pts], [r[primary] for r in pts], "o-", label=item.run.name)
    soup_value = summary.get("valid", {}).get(primary)
    if soup_value is not None:
        ax.axhline(soup_value, color="k", ls="--", label=f"soup ({soup_value:.3f})")
    ax.set_xlabel("fine-tune step")
    ax.set_ylabel(f"held-out {primary}")
    ax.set_title(f"soup of {len(items)} fine-tunes: {out.name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    p = tool_parser(__doc__)
    p.add_argument("runs", nargs="+", type=Path, help="dlr-train run directories")
    p.add_argument("--out", type=Path, required=True, help="the soup's run directory")
    p.add_argument(
        "--with-start",
        action="store_true",
        help="also average in the weights the runs started from (their --init-from directory)",
    )
    p.add_argument(
        "--checkpoint",
        choices=CHECKPOINTS,
        default=MODEL_DIR,
        help="each run's best checkpoint (model/), its last step's (last/) or its weight "
        "average at its last epoch end (ema/, runs with --ema-decay)",
    )
    p.add_argument(
        "--start",
        type=Path,
        help="the weights every run started from, when their --init-from paths differ or now "
        "hold other weights (you vouch for it); averaged in with --with-start",
    )
    args = parse_tool_args(p, argv)
    command = tool_command("training.soup", argv)
    try:
        summary = make_soup(
            args.runs, args.out, command, args.with_start, args.checkpoint, args.start
        )
    except SoupError as e:
        p.exit(2, f"error: {e}\n")
    print(json.dumps({"out": str(args.out), "valid": summary.get("valid")}, indent=1))


if __name__ == "__main__":
    main()
