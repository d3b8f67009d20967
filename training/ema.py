"""An exponential moving average of the weights during a run (`--ema-decay`).

After every optimiser step the average moves towards the live weights:
`avg <- decay * avg + (1 - decay) * live`, so it spans the last ~1 / (1 - decay) steps. The
average is what the run evaluates every epoch and keeps as its best checkpoint (`model/`);
the live weights stay in `last/` for resuming, the average beside them
(`last/ema.safetensors`), and the average at the latest epoch end is a checkpoint of its own
(`ema/`), so the live and averaged weights of one run can be scored alike.

It is torch's `AveragedModel` with its EMA update (`torch.optim.swa_utils`), buffers
included; the decay and the number of updates go with the saved tensors, so a resumed run
continues the same average. This is the in-run counterpart of `training/soup.py`, which
averages the end points of several runs.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from .state import atomic_replace

EMA_FILE = "ema.safetensors"  # in last/: the average's tensors and its update count
_COUNT = "__ema_updates__"


def make_ema(model: nn.Module, decay: float) -> AveragedModel | None:
    """The running average of `model` (a copy of it now), or None when `decay` is 0."""
    if decay == 0.0:
        return None
    if not 0.0 < decay < 1.0:
        raise ValueError(f"--ema-decay must be in (0, 1) or 0 (off), got {decay}")
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


def save_ema(ema: AveragedModel, path: Path) -> None:
    """Write the averaged weights and the update count to `path/ema.safetensors`."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in ema.module.state_dict().items()}
    tensors[_COUNT] = ema.n_averaged.detach().cpu().reshape(1)
    atomic_replace(lambda tmp: save_file(tensors, tmp), path / EMA_FILE)


def load_ema(ema: AveragedModel, path: Path, device: torch.device) -> None:
    """Restore an average written by `save_ema` (for --resume)."""
    if not (path / EMA_FILE).is_file():
        raise FileNotFoundError(
            f"{path} has no {EMA_FILE}: the run was not trained with --ema-decay; "
            "resume it without that option"
        )
    tensors = load_file(path / EMA_FILE, device=str(device))
    count = tensors.pop(_COUNT)
    ema.module.load_state_dict(tensors)
    ema.n_averaged.copy_(count.reshape(()).to(ema.n_averaged.dtype))
