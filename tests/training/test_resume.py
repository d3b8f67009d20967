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
from training.state import atomic_replace
from training.trainer import Trainer


class Interrupted(Exception):
    pass


class InterruptAfter:
    """A recipe mixin: the data stream dies after `stop_after` batches of the run."""

    def __init__(self, *args: Any, stop_after: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_after = stop_after
        self.served = 0

    def train_batches(self, epoch: int, start: int) -> Iterator[Any]:
        for batch in super().train_batches(epoch, start):  # type: ignore[misc]
            if self.served == self.stop_after:
                raise Interrupted
            self.served += 1
            yield batch


class InterruptingLM(InterruptAfter, LMRecipe):
    """The real LM recipe, interrupted."""


class AuxLM(LMRecipe):
    """The LM recipe with an auxiliary module (trained, never in the checkpoint)."""

    def auxiliary(self) -> torch.nn.Module:
        with torch.random.fork_rng():
            torch.manual_seed(7)
            self.aux = torch.nn.Linear(4, 1)
        return self.aux

    def loss(self, model, batch, device):
        loss, n = super().loss(model, batch, device)
        extra = (self.aux(torch.ones(1, 4)) - 3.0).pow(2).sum()
        return loss + 0.1 * extra, n


class InterruptingAuxLM(InterruptAfter, AuxLM):
    """The LM recipe with an auxiliary module, interrupted."""


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


def test_an_auxiliary_module_trains_resumes_and_stays_out_of_the_checkpoint(
    tmp_path: Path, text_dir: Path
) -> None:
    opts, model, train = _setup(text_dir, tmp_path / "full")
    full_recipe = AuxLM(opts, model, train)
    Trainer(full_recipe, train).run()
    with torch.random.fork_rng():
        torch.manual_seed(7)
        start = torch.nn.Linear(4, 1)
    assert not torch.equal(full_recipe.aux.weight.detach(), start.weight)  # it was trained

    opts, model, train = _setup(text_dir, tmp_path / "cut")
    with pytest.raises(Interrupted):
        Trainer(InterruptingAuxLM(opts, model, train, stop_after=7), train).run()
    opts, model, train = _setup(text_dir, tmp_path / "cut", resume=True)
    Trainer(AuxLM(opts, model, train), train).run()

    for run in ("full", "cut"):
        ckpt = load_file(tmp_path / run / "model" / "model.safetensors")
        plain = load_file(tmp_path / "cut" / "last" / "model.safetensors")
        assert ckpt.keys() == plain.keys() and not any("aux" in k for k in ckpt)
    full_aux = load_file(tmp_path / "full" / "last" / "auxiliary.safetensors")
    cut_aux = load_file(tmp_path / "cut" / "last" / "auxiliary.safetensors")
    assert full_aux.keys() == {"weight", "bias"}
    for name in full_aux:
        torch.testing.assert_close(cut_aux[name], full_aux[name], rtol=1e-6, atol=1e-7)
    full = load_file(tmp_path / "full" / "last" / "model.safetensors")
    resumed = load_file(tmp_path / "cut" / "last" / "model.safetensors")
    for name in full:
        torch.testing.assert_close(resumed[name], full[name], rtol=1e-6, atol=1e-7, msg=name)


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    """`last/`'s files (train state, weight average, auxiliary modules) are written through a
    temporary file and a rename: a write that dies halfway keeps the previous version."""
    path = tmp_path / "ema.safetensors"
    atomic_replace(lambda tmp: Path(tmp).write_bytes(b"first"), path)

    def dies_halfway(tmp: str) -> None:
        Path(tmp).write_bytes(b"sec")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_replace(dies_halfway, path)
    assert path.read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["ema.safetensors"]  # no temporary left
