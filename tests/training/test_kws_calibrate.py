"""Rejection calibration (`training.kws_calibrate`): the bias chosen on valid scores, and the
calibrated classifier in every form (offline == chunk == step, float64)."""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from training.data.sc12 import SIL, UNK
from training.data.vocab import SC12_LABELS
from training.kws_calibrate import choose, plot_sweep, sweep, with_unknown_bias


def scores_and_labels() -> tuple[torch.Tensor, torch.Tensor]:
    """Four command clips and four unknown-word clips with hand-set logits."""
    labels = torch.tensor([0, 1, 2, 3, UNK, UNK, UNK, SIL])
    s = torch.zeros(8, len(SC12_LABELS))
    for i, lab in enumerate(labels[:4]):
        s[i, lab] = 2.0  # commands win by 2, 2, 2 and (below) 0.3
    s[3, UNK] = 1.7
    s[4, 5], s[5, 6], s[6, UNK] = 1.0, 0.4, 1.0  # two unknown words called commands
    s[7, SIL] = 3.0
    return s, labels


def test_sweep_and_choose_the_smallest_bias_within_the_target() -> None:
    s, labels = scores_and_labels()
    points = sweep(s, labels, [0.0, 0.5, 1.0, 1.5])
    assert [p.false_accept for p in points] == [0.5, 0.25, 0.25, 0.0]  # a tie keeps the command
    assert [p.command_accuracy for p in points] == [1.0, 0.75, 0.75, 0.75]
    assert choose(points, 0.3).unknown_bias == 0.5
    assert choose(points, 0.0).unknown_bias == 1.5
    assert choose(points, 1.0).unknown_bias == 0.0
    with pytest.raises(ValueError, match="no bias up to 0.5"):
        choose(points[:2], 0.1)


def test_the_sweep_is_plotted(tmp_path) -> None:
    s, labels = scores_and_labels()
    points = sweep(s, labels, [0.0, 0.5, 1.0, 1.5])
    path = tmp_path / "calibration.png"
    plot_sweep(points, choose(points, 0.3), 0.3, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("union", [0, 5], ids=["one-row", "union-head"])
def test_the_calibrated_classifier_streams_exactly(union: int) -> None:
    cfg = DLRConfig(
        d_model=16, d_state=8, n_layers=2, encoder="audio", decoder="classifier",
        labels=list(SC12_LABELS), frame_stride=160, frontend="logmel", n_mels=16,
        pool_window_s=0.3, sample_rate=16000, unknown_classes=union,
    )  # fmt: skip
    model = DLRModel(cfg, seed=0).double().eval()
    x = torch.randn(2, 4000, dtype=torch.float64) * 0.1
    before = model(x)
    with_unknown_bias(model, 0.75)
    after = model(x)  # (B, T, C): only the _unknown_ logit moves, by the bias
    assert torch.allclose(
        after[..., UNK] - before[..., UNK], torch.full_like(after[..., UNK], 0.75)
    )
    others = [c for c in range(len(SC12_LABELS)) if c != UNK]
    assert torch.equal(after[..., others], before[..., others])
    rec = to_recurrent(model, dtype=torch.complex128)
    state = rec.init_state(2)
    chunks = []
    for start in range(0, x.shape[1], 700):
        y, state = rec.chunk(x[:, start : start + 700], state)
        chunks.append(y)
    assert torch.allclose(torch.cat(chunks, 1), after, atol=1e-10, rtol=0)
    state, steps = rec.init_state(2), []
    for t in range(1600):
        y, state = rec.step(x[:, t], state)
        if (t + 1) % cfg.frame_stride == 0:
            steps.append(y)
    assert torch.allclose(torch.stack(steps, 1), after[:, :10], atol=1e-10, rtol=0)
