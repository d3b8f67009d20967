"""Configuration of a training run: the options shared by every recipe.

`TrainConfig` holds the optimisation, schedule, checkpointing and device options; the model
architecture is a `dlr_runtime.DLRConfig` built by each recipe from the same command line
(`training.cli`). Both are stored in the run directory (`run.json`) and in the checkpoint's
training summary, so a run can be resumed and reproduced from its output directory alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass
class TrainConfig:
    out_dir: str = "runs/train"  # run directory: checkpoints, metrics, plots
    seed: int = 0  # seeds model init, data order and augmentation
    device: str = "auto"  # "auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:1"...
    amp: bool = True  # bfloat16 autocast on CUDA (SSM kernels/FFTs stay in float32); no-op on CPU
    threads: int = 0  # torch intra-op threads on CPU (0: leave torch's default)
    batch_size: int = 32  # per process (torchrun: global batch = batch_size * world size)
    epochs: int = 10  # number of epochs (an epoch is `steps_per_epoch` steps for stream recipes)
    steps: int = 0  # total optimiser steps; 0: epochs * steps per epoch
    max_minutes: float = 0.0  # stop (then evaluate and finish) after this time (0: none)
    steps_per_epoch: int = 0  # stream recipes (LM, synthetic): steps between evaluations
    lr: float = 3e-3  # peak learning rate of every parameter outside the SSM layers
    ssm_lr: float = 1e-3  # peak learning rate of the SSM layers' parameters (lambda, W, ...)
    weight_decay: float = 0.05  # AdamW decay of matrices outside the SSM layers
    ssm_weight_decay: float = 0.0  # decay of the SSM parameters (the paper uses none)
    betas: tuple[float, float] = (0.9, 0.98)  # AdamW betas
    warmup: int = 100  # linear warmup steps
    min_lr_ratio: float = 0.05  # cosine decays to min_lr_ratio * peak
    grad_clip: float = 1.0  # max global gradient norm (0: no clipping)
    num_workers: int = 1  # DataLoader worker processes (map-style datasets)
    eval_batches: int = 0  # cap on evaluation batches (0: the whole held-out split)
    save_every: int = 200  # also save a resumable state every this many steps (0: epoch ends)
    log_every: int = 10  # write a training metrics line every this many steps
    resume: bool = False  # continue from <out_dir>/last if it exists
    init_from: str = ""  # start from this model directory's weights (same shapes); not resumed
    ema_decay: float = 0.0  # weight average over ~1/(1-decay) steps, evaluated and kept (0: off)
    progress: bool = True  # tqdm progress bar

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent option."""
        positive = ("batch_size", "epochs", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        for name in ("steps", "steps_per_epoch", "warmup", "save_every", "eval_batches", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        if self.lr <= 0 or self.ssm_lr <= 0:
            raise ValueError(f"learning rates must be > 0, got lr={self.lr} ssm_lr={self.ssm_lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.max_minutes < 0:
            raise ValueError(f"--max-minutes must be >= 0, got {self.max_minutes}")
        if self.grad_clip < 0:
            raise ValueError(f"--grad-clip must be >= 0, got {self.grad_clip}")
        if self.ema_decay != 0.0 and not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"--ema-decay must be in (0, 1) or 0 (off), got {self.ema_decay}")
        if self.num_workers < 0:
            raise ValueError(f"--num-workers must be >= 0, got {self.num_workers}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)
