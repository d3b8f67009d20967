"""Data-parallel training: torchrun starts 2 CPU processes (gloo) that train a few steps, and
their copies of the model stay equal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .conftest import TINY_MODEL

# two torchrun processes: full suite only
pytestmark = pytest.mark.slow


def test_torchrun_two_gloo_processes_run_a_step(tmp_path: Path, text_dir: Path) -> None:
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "training.cli",
        "lm",
        "--device",
        "cpu",
        "--text",
        str(text_dir),
        "--out-dir",
        str(out),
        "--steps",
        "2",
        "--steps-per-epoch",
        "2",
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--eval-tokens",
        "32",
        "--valid-fraction",
        "0.34",
        "--samples",
        "0",
        "--no-progress",
        "--threads",
        "1",
        "--log-every",
        "1",
        *TINY_MODEL,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[2]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2
    assert summary["items_seen"] == 2 * 2 * 2 * 16  # steps x processes x batch x seq_len


def test_processes_keep_equal_copies_whatever_the_recipe_calls(
    tmp_path: Path, text_dir: Path
) -> None:
    """A recipe that calls its model's parts directly (as kws does) and trains an auxiliary
    module started and pulled differently on each process: every copy must stay equal."""
    script = Path(__file__).with_name("ddp_replicas.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(script), str(text_dir), str(tmp_path)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[2]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (load_file(tmp_path / f"rank{r}.safetensors") for r in (0, 1))
    for name in ("model", "aux"):
        assert torch.equal(a[f"{name}_start"], b[f"{name}_start"]), name  # rank 0's start
        assert torch.equal(a[name], b[name]), name  # every step's update the same
        assert not torch.equal(a[name], a[f"{name}_start"]), name  # and trained
