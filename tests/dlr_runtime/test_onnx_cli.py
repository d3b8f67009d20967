"""`dlr-export onnx CKPT OUT` writes a directory that `OnnxBackend.from_dir` serves with the
runtime's outputs (float32 graphs vs complex64 RecurrentModel: max abs error 1e-4)."""

from __future__ import annotations

import torch

from dlr_runtime import load_recurrent
from dlr_runtime.backends.onnx import OnnxBackend
from dlr_runtime.export.cli import main as export_main


def test_export_onnx_cli_round_trip(models_dir, tmp_path):
    ckpt = models_dir / "tiny-speech"
    assert export_main(["onnx", str(ckpt), str(tmp_path / "g"), "--max-chunk", "4"]) == 0
    be = OnnxBackend.from_dir(tmp_path / "g")
    rec = load_recurrent(ckpt)
    assert be.config == rec.config and be.max_chunk == 4
    audio = torch.randn(2, 7 * 160 + 33, generator=torch.Generator().manual_seed(3)) * 0.3
    y, s = be.chunk(audio, be.init_state(2))
    y_ref, s_ref = rec.chunk(audio, rec.init_state(2))
    assert y.shape == y_ref.shape == (2, 7, 10)
    assert (y - y_ref).abs().max().item() < 1e-4
    assert (be.scores(s) - rec.scores(s_ref)).abs().max().item() < 1e-4


def test_export_onnx_cli_bad_checkpoint(tmp_path, capsys):
    assert export_main(["onnx", str(tmp_path / "nope"), str(tmp_path / "g")]) == 2
    assert "cannot load checkpoint" in capsys.readouterr().err
