"""The memory cap of a trained audio model (`training.cap_memory`): slow modes made as slow as
the cap and no slower, fast ones untouched, the streaming forms still exact, refusals, and a
capped run directory that reads like a training run's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, load_checkpoint, to_recurrent
from training.cap_memory import cap_memory, time_constants
from training.cap_memory import main as cap_main
from training.cli import main as train_main

from .conftest import QUIET, TINY_MODEL

LABELS = ["yes", "no", "_silence_", "_unknown_"]


def audio_model(seed: int = 0, **kw) -> DLRModel:
    cfg = DLRConfig(
        d_model=8, d_state=6, n_layers=2, encoder="audio", decoder="classifier", labels=LABELS,
        frame_stride=320, frontend="logmel", pool_window_s=0.3, dt_min=1e-4, dt_max=0.5, **kw,
    )  # fmt: skip
    return DLRModel(cfg, seed=seed).double().eval()


def test_slow_modes_are_capped_and_fast_ones_untouched():
    model = audio_model()
    before = time_constants(model)
    cap = 2.0
    assert before.max() > cap  # dt_min 1e-4 at 20 ms frames: modes of minutes
    capped, moved = cap_memory(model, cap)
    after = time_constants(capped)
    slow = before > cap
    assert moved == int(slow.sum()) > 0
    assert float(after.max()) == pytest.approx(cap, rel=1e-6)
    assert torch.allclose(after[slow], torch.full_like(after[slow], cap), rtol=1e-6)
    assert torch.equal(after[~slow], before[~slow])
    assert time_constants(model).equal(before)  # the input model is not modified
    x = 0.3 * torch.randn(2, 320 * 40, generator=torch.Generator().manual_seed(1)).double()
    with torch.no_grad():
        ref = capped(x)
    rec = to_recurrent(capped, dtype=torch.complex128)
    y, _ = rec.chunk(x, rec.init_state(2))
    assert float((y - ref).abs().max() / ref.abs().max()) < 1e-10
    assert not torch.allclose(ref, model(x))  # the cap changed what it computes


def test_the_floor_of_min_decay_counts():
    model = audio_model(min_decay=0.02)  # every mode already forgets within 1 s (50 frames)
    capped, moved = cap_memory(model, 2.0)
    assert moved == 0
    assert torch.equal(time_constants(capped), time_constants(model))


def test_refusals():
    with pytest.raises(ValueError, match="positive"):
        cap_memory(audio_model(), 0.0)
    lm = DLRModel(DLRConfig(d_model=8, d_state=4, n_layers=1, vocab_size=11), seed=0)
    with pytest.raises(ValueError, match="audio models"):
        cap_memory(lm, 2.0)
    s4d = audio_model(layer="s4d")
    with pytest.raises(ValueError, match="dlr layer"):
        cap_memory(s4d, 2.0)
    assert math.isfinite(float(time_constants(audio_model()).max()))


@pytest.mark.slow
def test_capped_run_directory(tmp_path: Path):
    run, out = tmp_path / "kws", tmp_path / "capped"
    argv = [
        "kws", "--out-dir", str(run), "--cache-dir", str(tmp_path / "cache"), "--tiny-corpus",
        "--batch-size", "4", "--epoch-windows", "8", "--valid-clips", "24", "--valid-silence", "4",
        "--warmup", "1", "--num-workers", "0", "--workers", "1", "--steps", "2",
        "--dt-min", "0.0001", *TINY_MODEL, *QUIET,
    ]  # fmt: skip
    assert train_main(argv) == 0
    cap_main([str(run), "--cap-s", "0.5", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory_cap"]["modes_capped"] > 0
    assert summary["memory_cap"]["longest_after_s"] == pytest.approx(0.5, rel=1e-6)
    for form in ("complex64", "complex128"):
        assert summary["streaming"][form]["final_prediction_agreement"] == 1.0
    assert {"accuracy", "context_accuracy"} <= set(summary["valid"])
    model = load_checkpoint(out / "model")
    assert float(time_constants(model).max()) == pytest.approx(0.5, rel=1e-6)
    assert (out / "curves.png").is_file() and (out / "metrics.csv").is_file()
    with pytest.raises(SystemExit):
        cap_main([str(run), "--cap-s", "-1", "--out", str(tmp_path / "bad")])
