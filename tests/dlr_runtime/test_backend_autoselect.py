"""Auto-selection of the backend by measurement: every candidate is timed, the fastest is
returned, broken candidates are skipped, and the chosen backend computes the model."""

from __future__ import annotations

import math

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends.autoselect import build, measure, pick_fastest

CFG = DLRConfig.preset("tiny-lm", n_layers=1, vocab_size=20, init="omega")


@pytest.fixture(scope="module")
def rec():
    return to_recurrent(DLRModel(CFG, seed=0))


@pytest.mark.slow  # builds and times every candidate backend
def test_picks_the_fastest_measured(rec):
    name, be, timings = pick_fastest(rec, candidates=("torch", "onnx"), batch_sizes=(1,), reps=3)
    assert set(timings) == {"torch", "onnx"}
    assert all(0 < t < math.inf for t in timings.values())
    assert name == min(timings, key=timings.get)
    assert be.name == name if name == "onnx" else be is rec
    x = torch.randint(0, 20, (2, 5))
    y, _ = be.chunk(x, be.init_state(2))
    y_ref, _ = rec.chunk(x, rec.init_state(2))
    assert (y - y_ref).abs().max().item() < 1e-4


def test_broken_candidate_is_skipped(rec):
    name, be, timings = pick_fastest(
        rec, candidates=("nonsense", "torch"), batch_sizes=(1,), reps=2
    )
    assert timings["nonsense"] == math.inf
    assert name == "torch" and be is rec


def test_all_broken_falls_back_to_torch(rec):
    name, be, _ = pick_fastest(rec, candidates=("nonsense",), batch_sizes=(1,), reps=1)
    assert name == "torch" and be is rec
    with pytest.raises(ValueError):
        pick_fastest(rec, candidates=())


def test_measure_audio_uses_chunks():
    cfg = DLRConfig.preset("micro-speech")
    audio_rec = to_recurrent(DLRModel(cfg, seed=0))
    assert measure(build(audio_rec, "torch"), (1, 2), reps=2) > 0


def test_calibration_timer_runs_with_the_process_thread_count() -> None:
    import time

    from dlr_runtime.backends.timing import per_call_seconds

    seen: list[int] = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sec = per_call_seconds(lambda: (seen.append(torch.get_num_threads()), time.sleep(0.002)), 3)
    finally:
        torch.set_num_threads(before)
    assert set(seen) == {2} and len(seen) >= 3 + 2  # the timed block plus the warm-up
    assert 0.002 <= sec < 0.5
    with pytest.raises(ValueError, match="calls"):
        per_call_seconds(lambda: None, 0)
