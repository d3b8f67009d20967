"""Resume after an interruption: the resumed run ends exactly where an uninterrupted one does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from training.config import TrainConfig
from training.modelopts import ModelOptions
from training.recipes.lm import LMOptions, LMRecipe
from training.trainer import Trainer


class Interrupted(Exception):
    pass


class InterruptingLM(LMRecipe):
    """The real LM recipe, whose data stream dies after `stop_after` batches of the run."""

    def __init__(self, *args: Any, stop_after: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_after = stop_after
        self.served = 0

    def train_batches(self, epoch: int, start: int) -> Iterator[Any]:
        for batch in super().train_batches(epoch, start):
            if self.served == self.stop_after:
                raise Interrupted
            self.served += 1
            yield batch


def _setup(
    text_dir: Path, out: Path, resume: bool = False
) -> tuple[LMOptions, ModelOptions, TrainConfig]:
    opts = LMOptions(
        text=(str(text_dir),),
        seq_len=16,
        eval_tokens=64,
        valid_fraction=0.34,
        samples=1,
        sample_bytes=4,
    )
    model = ModelOptions(d_model=16, d_state=8, n_layers=2, dropout=0.1)  # dropout: RNG matters
    train = TrainConfig(
        out_dir=str(out),
        steps=9,
        steps_per_epoch=4,
        batch_size=4,
        warmup=2,
        save_every=2,
        progress=False,
        log_every=1,
        threads=1,
        resume=resume,
    )
    return opts, model, train


def test_resume_matches_an_uninterrupted_run(tmp_path: Path, text_dir: Path) -> None:
    opts, model, train = _setup(text_dir, tmp_path / "full")
    Trainer(LMRecipe(opts, model, train), train).run()

    opts, model, train = _setup(text_dir, tmp_path / "cut")
    with pytest.raises(Interrupted):  # dies in epoch 2, after step 7; last save at step 6
        Trainer(InterruptingLM(opts, model, train, stop_after=7), train).run()
    state = json.loads((tmp_path / "cut" / "last" / "train_state.json").read_text())
    assert state["progress"]["step"] == 6 and state["progress"]["epoch"] == 1

    opts, model, train = _setup(text_dir, tmp_path / "cut", resume=True)
    summary = Trainer(LMRecipe(opts, model, train), train).run()
    assert summary["steps"] == 9

    full = load_file(tmp_path / "full" / "last" / "model.safetensors")
    resumed = load_file(tmp_path / "cut" / "last" / "model.safetensors")
    assert full.keys() == resumed.keys()
    for name in full:
        torch.testing.assert_close(resumed[name], full[name], rtol=1e-6, atol=1e-7, msg=name)
    steps = [
        json.loads(x)["step"]
        for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
        if json.loads(x)["kind"] == "train"
    ]
    assert steps == list(range(1, 10))  # records past the saved step were dropped, none repeated
