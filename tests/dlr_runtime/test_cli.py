"""dlr-convert writes a recurrent checkpoint that reproduces the training form."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from dlr_runtime import DLRConfig, DLRModel, load_checkpoint, save_checkpoint
from dlr_runtime.cli import convert_main


def test_convert(tmp_path: Path, capsys) -> None:
    model = DLRModel(DLRConfig.preset("micro-lm", layer="lru"), seed=0)
    save_checkpoint(model, tmp_path / "train", tokenizer={"type": "bytes"})
    assert convert_main([str(tmp_path / "train"), str(tmp_path / "rec")]) == 0
    out = capsys.readouterr().out
    assert "bytes/session" in out and "max |conv - chunk|" in out
    rec = load_checkpoint(tmp_path / "rec")
    assert rec.checkpoint_metadata["tokenizer"] == {"type": "bytes"}
    x = torch.randint(0, 20, (1, 40))
    with torch.no_grad():
        want = model.double()(x)
    got, _ = rec.chunk(x, rec.init_state(1))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_convert_bad_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dlr_runtime.cli", str(tmp_path / "missing"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "checkpoint not found" in proc.stderr and "Traceback" not in proc.stderr
