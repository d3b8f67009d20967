"""Resumable training state: optimiser moments, step counters and RNG, without pickle.

Written next to the model checkpoint in `<out_dir>/last/`:
- `train_state.safetensors`: every tensor of the optimiser state (`opt.<param>.<key>`) and the
  torch RNG state (`rng.cpu`, `rng.cuda`);
- `train_state.json`: counters (step, epoch, step within the epoch, best metric, elapsed time),
  the optimiser's param groups and scalar state, and the run configuration.
Both files are written to temporary names and renamed, so an interruption while saving leaves
the previous state readable.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

STATE_TENSORS = "train_state.safetensors"
STATE_JSON = "train_state.json"


@dataclass
class Progress:
    """Where a run is: counters that, with the seed, determine the rest of the run."""

    step: int = 0  # optimiser steps done
    epoch: int = 0  # current epoch (0-based)
    step_in_epoch: int = 0  # steps done inside `epoch`
    best: float | None = None  # best value of the recipe's primary held-out metric so far
    best_step: int = -1  # step at which `best` was reached
    elapsed_s: float = 0.0  # training wall time so far, across resumes
    items: int = 0  # training examples (or tokens) consumed so far
    history: list[dict[str, Any]] = field(default_factory=list)  # per-epoch eval results


def atomic_replace(write: Callable[[str], object], path: Path) -> None:
    """Write `path` through `write(tmp)` on a temporary file beside it, then rename: a crash
    leaves the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_train_state(
    path: str | Path, opt: torch.optim.Optimizer, progress: Progress, run: dict[str, Any]
) -> None:
    """Write the optimiser state, RNG and `progress` to directory `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value) and value.dim() > 0:
                tensors[f"opt.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = float(value)
    tensors["rng.cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    meta = {
        "progress": asdict(progress),
        "param_groups": sd["param_groups"],
        "scalar_state": scalars,
        "run": run,
    }
    atomic_replace(lambda tmp: save_file(tensors, tmp), path / STATE_TENSORS)
    atomic_replace(lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)), path / STATE_JSON)


def has_train_state(path: str | Path) -> bool:
    path = Path(path)
    return (path / STATE_TENSORS).is_file() and (path / STATE_JSON).is_file()


def load_train_state(
    path: str | Path, opt: torch.optim.Optimizer, device: torch.device
) -> tuple[Progress, dict[str, Any]]:
    """Restore the optimiser and RNG from `path`; return (progress, run configuration)."""
    path = Path(path)
    if not has_train_state(path):
        raise FileNotFoundError(f"no resumable training state in {path}")
    meta = json.loads((path / STATE_JSON).read_text())
    tensors = load_file(path / STATE_TENSORS)
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if not name.startswith("opt."):
            continue
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value.to(device)
    for idx, values in meta["scalar_state"].items():
        for key, value in values.items():
            state.setdefault(int(idx), {})[key] = torch.tensor(value)
    groups = meta["param_groups"]
    for g in groups:  # JSON turns tuples into lists
        g.update({k: tuple(v) for k, v in g.items() if k == "betas" and isinstance(v, list)})
    opt.load_state_dict({"state": state, "param_groups": groups})
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and device.type == "cuda":
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    return Progress(**meta["progress"]), meta["run"]
