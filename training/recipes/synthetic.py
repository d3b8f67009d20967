"""Synthetic-task recipe: one task of the paper's suite (training.data.synthetic), generated on
the fly at a chosen length, learned by a DLR stack or by the small attention baseline.

Models map real input features (B, T, in) to outputs (B, T, out) causally. The DLR stack reuses
dlr_runtime's blocks (`Block`: norm -> diagonal SSM -> GELU -> GLU projection -> residual) with a
linear input and output map; the attention baseline is `TransformerRegressor`. Training
minimises the masked MSE; the held-out metric is the task's score (R^2 on scored positions,
1 = perfect) on fixed, seeded batches never used in training.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlr_runtime import DLRConfig
from dlr_runtime.model import Block, make_norm
from training.baselines.transformer import TransformerConfig, TransformerRegressor
from training.config import TrainConfig
from training.data.synthetic import (
    TASKS,
    in_features,
    input_length,
    make_batch,
    masked_mse,
    out_features,
    score,
)
from training.distributed import DistContext
from training.modelopts import ModelOptions
from training.plain_checkpoint import save_plain
from training.trainer import Recipe

VALID_SEED, TEST_SEED = 1_000_001, 2_000_003


@dataclass
class SyntheticOptions:
    task: str = "cumsum"  # one of the suite's tasks (see `dlr-train suite --help`)
    length: int = 128  # sequence length L of the task
    arch: str = "dlr"  # dlr | attention (the small Transformer baseline)
    heldout_batches: int = 4  # held-out batches scored at each evaluation
    heads: int = 4  # attention baseline: heads


class DLRSequenceModel(nn.Module):
    """Real features (B, T, in) -> (B, T, out) through DLR blocks; causal."""

    def __init__(self, cfg: DLRConfig, n_in: int, n_out: int, seed: int | None = None) -> None:
        super().__init__()
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        if seed is not None:
            torch.manual_seed(seed)
        self.config = cfg
        self.inp = nn.Linear(n_in, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, gen) for _ in range(cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.prenorm else nn.Identity()
        self.out = nn.Linear(cfg.d_model, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)  # (B, T, H)
        for block in self.blocks:
            h = block(h)
        return self.out(self.norm(h))  # (B, T, out)


class SyntheticRecipe(Recipe):
    name = "synthetic"
    primary = "score"
    higher_is_better = True
    items_name = "seqs"

    def __init__(
        self, opts: SyntheticOptions, model_opts: ModelOptions, train: TrainConfig
    ) -> None:
        if opts.task not in TASKS:
            raise ValueError(f"unknown task {opts.task!r}; expected one of {sorted(TASKS)}")
        if opts.arch not in ("dlr", "attention"):
            raise ValueError(f"--arch must be dlr or attention, got {opts.arch!r}")
        if opts.length < 2:
            raise ValueError(f"--length must be >= 2, got {opts.length}")
        self.opts = opts
        self.model_opts = model_opts
        self.batch_size = train.batch_size
        self.seed = train.seed
        self.spe = train.steps_per_epoch or 100
        self.rank = 0
        self.model_config: dict[str, Any] = {}

    def describe(self) -> dict[str, Any]:
        return {"synthetic": asdict(self.opts), "model": self.model_opts.to_dict()}

    def setup(self, ctx: DistContext) -> None:
        self.rank = ctx.rank
        self.heldout = {
            split: [
                self._batch(torch.Generator().manual_seed(seed + i))
                for i in range(self.opts.heldout_batches)
            ]
            for split, seed in (("valid", VALID_SEED), ("test", TEST_SEED))
        }

    def _batch(self, gen: torch.Generator):
        return make_batch(self.opts.task, self.batch_size, self.opts.length, gen)

    def build_model(self) -> nn.Module:
        o, m = self.opts, self.model_opts
        n_in, n_out = in_features(o.task), out_features(o.task)
        if o.arch == "dlr":
            cfg = m.to_config()
            self.model_config = {"dlr": cfg.to_dict(), "in": n_in, "out": n_out}
            return DLRSequenceModel(cfg, n_in, n_out, seed=self.seed)
        tcfg = TransformerConfig(
            d_model=m.d_model,
            n_layers=m.n_layers,
            n_heads=o.heads,
            max_len=input_length(o.task, o.length),
            dropout=m.dropout,
        )
        self.model_config = {"transformer": tcfg.to_dict(), "in": n_in, "out": n_out}
        torch.manual_seed(self.seed)
        return TransformerRegressor(tcfg, n_in, n_out)

    def steps_per_epoch(self) -> int:
        return self.spe

    def train_batches(self, epoch: int, start: int) -> Iterator[Any]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch * 101 + self.rank)
        for i in range(self.spe):
            batch = self._batch(gen)
            if i >= start:
                yield batch

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        x, y, mask = (t.to(device) for t in batch)  # (B, T, in), (B, T, out), (B, T)
        return masked_mse(model(x).float(), y, mask), x.shape[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device, split: str = "valid") -> dict:
        was = model.training
        model.eval()
        preds, targets, masks = [], [], []
        for x, y, mask in self.heldout[split]:
            preds.append(model(x.to(device)).float().cpu())
            targets.append(y)
            masks.append(mask)
        model.train(was)
        p, t, m = torch.cat(preds), torch.cat(targets), torch.cat(masks)
        return {"score": score(p, t, m), "loss": float(masked_mse(p, t, m))}

    def save_model(self, model: nn.Module, path: Path, summary: dict[str, Any]) -> None:
        save_plain(
            model,
            path,
            f"synthetic-{self.opts.arch}",
            self.model_config,
            task=self.opts.task,
            length=self.opts.length,
            training=summary,
        )
