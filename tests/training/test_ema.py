"""The in-run weight average (`--ema-decay`): its update against a plain loop, what the run
evaluates and keeps, and resuming."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from dlr_runtime.checkpoint import load_checkpoint
from training.config import TrainConfig
from training.ema import make_ema
from training.modelopts import ModelOptions
from training.recipes.lm import LMOptions, LMRecipe
from training.soup import main as soup_main
from training.trainer import Trainer

from .test_resume import Interrupted, InterruptingLM
from .test_resume import _setup as resume_setup

DECAY = 0.7  # short memory, so every step shows in the average


class RecordingLM(LMRecipe):
    """The LM recipe, keeping the weights each training batch is scored with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict[str, torch.Tensor]] = []

    def loss(self, model, batch, device):
        self.seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return super().loss(model, batch, device)


def _setup(text_dir: Path, out: Path, **train: Any) -> tuple[LMOptions, ModelOptions, TrainConfig]:
    """The resume test's tiny LM run, with the average on."""
    opts, model, cfg = resume_setup(text_dir, out)
    return opts, model, replace(cfg, **{"ema_decay": DECAY, **train})


def test_decay_is_checked() -> None:
    assert make_ema(torch.nn.Linear(2, 2), 0.0) is None
    for bad in (1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="ema-decay"):
            TrainConfig(ema_decay=bad).validate()
        with pytest.raises(ValueError, match="ema-decay"):
            make_ema(torch.nn.Linear(2, 2), bad)


def test_the_average_follows_a_plain_loop_and_is_what_the_run_scores(
    tmp_path: Path, text_dir: Path
) -> None:
    opts, model, train = _setup(text_dir, tmp_path / "run")
    recipe = RecordingLM(opts, model, train)
    Trainer(recipe, train).run()
    live = load_file(tmp_path / "run" / "last" / "model.safetensors")
    # the weights after steps 1..9: those the next batches were scored with, then the last
    after = [*recipe.seen[1:], live]
    assert len(after) == 9
    average = dict(after[0])  # the first update copies the weights
    for weights in after[1:]:
        average = {k: DECAY * average[k] + (1 - DECAY) * weights[k] for k in average}
    kept = load_file(tmp_path / "run" / "ema" / "model.safetensors")
    assert kept.keys() == live.keys()
    moved = 0
    for name in kept:
        torch.testing.assert_close(kept[name], average[name], rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(kept[name], live[name])
    assert moved > 0  # the average is not the live weights

    # every epoch's evaluation scored the average: rescoring ema/ gives the last record
    records = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n") if x
    ]
    last_eval = [r for r in records if r["kind"] == "eval"][-1]
    assert last_eval["step"] == 9
    rescored = recipe.evaluate(load_checkpoint(tmp_path / "run" / "ema"), torch.device("cpu"))
    assert rescored["bpb"] == pytest.approx(last_eval["bpb"], rel=1e-6)
    live_model = load_checkpoint(tmp_path / "run" / "ema")
    live_model.load_state_dict(live)
    assert recipe.evaluate(live_model, torch.device("cpu"))["bpb"] != pytest.approx(
        last_eval["bpb"], rel=1e-6
    )


def test_a_resumed_run_continues_the_same_average(tmp_path: Path, text_dir: Path) -> None:
    opts, model, train = _setup(text_dir, tmp_path / "full")
    Trainer(LMRecipe(opts, model, train), train).run()

    opts, model, train = _setup(text_dir, tmp_path / "cut")
    with pytest.raises(Interrupted):  # dies after step 7; the last save is at step 6
        Trainer(InterruptingLM(opts, model, train, stop_after=7), train).run()
    assert (tmp_path / "cut" / "last" / "ema.safetensors").is_file()
    opts, model, train = _setup(text_dir, tmp_path / "cut", resume=True)
    Trainer(LMRecipe(opts, model, train), train).run()

    for folder in ("ema", "model"):
        full = load_file(tmp_path / "full" / folder / "model.safetensors")
        resumed = load_file(tmp_path / "cut" / folder / "model.safetensors")
        for name in full:
            torch.testing.assert_close(resumed[name], full[name], rtol=1e-6, atol=1e-7, msg=name)


def test_a_fine_tunes_average_goes_into_a_soup(tmp_path: Path, text_dir: Path) -> None:
    opts, model, train = _setup(text_dir, tmp_path / "base", ema_decay=0.0)
    Trainer(LMRecipe(opts, model, train), train).run()
    opts, model, train = _setup(text_dir, tmp_path / "ft", init_from=str(tmp_path / "base/model"))
    Trainer(LMRecipe(opts, model, train), train).run()

    out = tmp_path / "soup"
    argv = [str(tmp_path / "ft"), "--with-start", "--checkpoint", "ema", "--out", str(out)]
    assert soup_main(argv) is None
    ema = load_file(tmp_path / "ft" / "ema" / "model.safetensors")
    start = load_file(tmp_path / "base" / "model" / "model.safetensors")
    soup = load_file(out / "model" / "model.safetensors")
    for name, t in soup.items():
        torch.testing.assert_close(t, (ema[name] + start[name]) / 2, atol=1e-6, rtol=0, msg=name)


def test_resuming_with_an_average_the_run_never_had_is_refused(tmp_path: Path, text_dir: Path):
    opts, model, train = _setup(text_dir, tmp_path / "plain", ema_decay=0.0)
    Trainer(LMRecipe(opts, model, train), train).run()
    opts, model, train = _setup(text_dir, tmp_path / "plain", resume=True)
    with pytest.raises(FileNotFoundError, match="not trained with --ema-decay"):
        Trainer(LMRecipe(opts, model, train), train).run()
