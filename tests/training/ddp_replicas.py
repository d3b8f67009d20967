"""Run by test_ddp.py under torchrun (2 processes): trains a few steps of a recipe that calls its
model's parts directly and has an auxiliary module; each process then writes its copies of the
model's and the module's parameters, at the first step and at the end, to
`argv[2]/rank<R>.safetensors` for the test to compare. Not a test module itself."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from training.config import TrainConfig
from training.modelopts import ModelOptions
from training.recipes.lm import LMOptions, LMRecipe
from training.trainer import Trainer


class DirectLM(LMRecipe):
    """The LM recipe, calling the model itself (as the kws recipe calls its parts) plus an
    auxiliary module that starts different on each process and is pulled to a different target
    on each, so only a synchronised run keeps the copies equal."""

    def build_model(self) -> nn.Module:
        self.model = super().build_model()
        self.start: dict[str, torch.Tensor] = {}  # the copies at the first step
        return self.model

    def auxiliary(self) -> nn.Module:
        with torch.random.fork_rng():
            torch.manual_seed(100 + dist.get_rank())
            self.aux = nn.Linear(4, 1)
        return self.aux

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        core = getattr(model, "module", model)  # a wrapper, if the trainer used one, is bypassed
        if not self.start:  # the first step: after the trainer's start-up, before any update
            self.start = {"model": flat(core), "aux": flat(self.aux)}
        loss, n = super().loss(core, batch, device)
        target = float(dist.get_rank() + 1)
        return loss + (self.aux(torch.ones(1, 4)) - target).pow(2).sum(), n


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def main() -> None:
    text_dir, out = sys.argv[1], Path(sys.argv[2])
    opts = LMOptions(text=(text_dir,), seq_len=16, eval_tokens=32, valid_fraction=0.34, samples=0)
    model_opts = ModelOptions(d_model=16, d_state=8, n_layers=2)
    train = TrainConfig(
        out_dir=str(out / "run"),
        steps=4,
        steps_per_epoch=4,
        batch_size=2,
        warmup=1,
        progress=False,
        threads=1,
        device="cpu",
    )
    recipe = DirectLM(opts, model_opts, train)
    Trainer(recipe, train).run()
    copies = {"model": flat(recipe.model), "aux": flat(recipe.aux)}
    copies.update({f"{k}_start": v for k, v in recipe.start.items()})
    save_file(copies, str(out / f"rank{os.environ['RANK']}.safetensors"))


if __name__ == "__main__":
    main()
