"""The peak-smoothed-posterior loss against a plain loop and against the detector's own value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.data.sc12 import IGNORE, MAX_PHONES, SIL, UNK, KWSItem
from training.peak_loss import (
    PeakLossConfig,
    false_peak_loss,
    false_peak_loss_reference,
    peak_span_loss,
    peak_span_loss_reference,
    smoothed,
    smoothed_softmax,
    span_index,
)
from training.stream_anatomy import smoothed_posteriors

WORDS = [*range(SIL), UNK]
WORD_T = torch.tensor(WORDS)
REJECT = [SIL, UNK]
COMMANDS = list(range(SIL))


def runs(targets: torch.Tensor, labels: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(row, start, end, label) of each run numbered by ``span_index``."""
    ids, run_labels = span_index(targets, labels)
    out = []
    for i, label in enumerate(run_labels.tolist()):
        rows, frames = torch.nonzero(ids == i, as_tuple=True)
        assert len(set(rows.tolist())) == 1  # a run stays in its row, contiguous
        assert frames.tolist() == list(range(int(frames[0]), int(frames[-1]) + 1))
        out.append((int(rows[0]), int(frames[0]), int(frames[-1]) + 1, label))
    return out


def random_targets(gen: torch.Generator, b: int, f: int) -> torch.Tensor:
    """Silence with IGNORE stretches and word runs, some of them back to back."""
    t = torch.full((b, f), SIL)
    for row in range(b):
        pos = int(torch.randint(0, 5, (1,), generator=gen))
        while pos < f - 2:
            kind = int(torch.randint(0, 3, (1,), generator=gen))
            n = int(torch.randint(1, 12, (1,), generator=gen))
            if kind == 0:
                t[row, pos : pos + n] = IGNORE
            else:
                t[row, pos : pos + n] = WORDS[int(torch.randint(len(WORDS), (1,), generator=gen))]
            pos += n + int(torch.randint(0, 4, (1,), generator=gen))
    return t


@pytest.mark.parametrize("k", [1, 3, 15, 60])
def test_fast_form_matches_the_plain_loop_in_float64(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    logits = torch.randn(4, 50, len(WORDS) + 1, generator=gen, dtype=torch.float64) * 3
    targets = random_targets(gen, 4, 50)
    fast = peak_span_loss(smoothed_softmax(logits, k), targets, WORD_T)
    ref = peak_span_loss_reference(logits, targets, WORDS, k)
    assert fast.dtype == torch.float64
    assert abs(float(fast - ref)) < 1e-12
    fast32 = peak_span_loss(smoothed_softmax(logits.float(), k), targets, WORD_T)
    assert abs(float(fast32) / float(ref) - 1) < 1e-5  # float32 softmax and cumulative sums


@pytest.mark.parametrize("k", [1, 3, 15, 60])
def test_false_peak_fast_form_matches_the_plain_loop_in_float64(k: int) -> None:
    gen = torch.Generator().manual_seed(100 + k)
    logits = torch.randn(4, 50, len(WORDS) + 1, generator=gen, dtype=torch.float64) * 3
    targets = random_targets(gen, 4, 50)
    reject, cmds = torch.tensor(REJECT), torch.tensor(COMMANDS)
    fast = false_peak_loss(smoothed_softmax(logits, k), targets, reject, cmds)
    ref = false_peak_loss_reference(logits, targets, REJECT, COMMANDS, k)
    assert abs(float(fast - ref)) < 1e-12
    fast32 = false_peak_loss(smoothed_softmax(logits.float(), k), targets, reject, cmds)
    assert abs(float(fast32) / float(ref) - 1) < 1e-5


def test_descending_the_false_peak_loss_keeps_an_unknown_word_below_the_threshold() -> None:
    logits = torch.zeros(1, 30, 12)
    logits[0, 8:22, 4] = 5.0  # a near miss the model takes for command 4
    logits.requires_grad_(True)
    t = torch.full((1, 30), SIL)
    t[0, 10:22] = UNK
    reject, cmds = torch.tensor(REJECT), torch.tensor(COMMANDS)
    before = smoothed(torch.softmax(logits.detach(), -1), 15)[0, :, :SIL].max()
    opt = torch.optim.SGD([logits], lr=5.0)
    for _ in range(60):
        opt.zero_grad()
        false_peak_loss(smoothed_softmax(logits, 15), t, reject, cmds).backward()
        opt.step()
    after = smoothed(torch.softmax(logits.detach(), -1), 15)[0, :, :SIL].max()
    assert float(before) > 0.5 and float(after) < 0.2


@pytest.mark.parametrize("k", [1, 15, 80])
def test_smoothing_is_the_detectors_smoothed_posterior(k: int) -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 60, 12, generator=gen, dtype=torch.float64)
    sm = smoothed(torch.softmax(logits, -1), k)
    for row in range(2):
        np.testing.assert_allclose(
            sm[row].numpy(), smoothed_posteriors(logits[row].numpy(), k), atol=1e-12
        )


def test_word_spans_split_on_label_changes_and_skip_silence_and_ignored_frames() -> None:
    t = torch.tensor([[SIL, 3, 3, 5, 5, IGNORE, 5, SIL, UNK, UNK], [IGNORE] * 4 + [0] * 6])
    assert runs(t, WORD_T) == [
        (0, 1, 3, 3),
        (0, 3, 5, 5),
        (0, 6, 7, 5),
        (0, 8, 10, UNK),
        (1, 4, 10, 0),
    ]


def test_a_batch_without_words_costs_nothing_and_still_backpropagates() -> None:
    logits = torch.randn(2, 10, 12, requires_grad=True)
    t = torch.full((2, 10), SIL)
    t[:, 3:6] = IGNORE
    loss = peak_span_loss(smoothed_softmax(logits, 5), t, WORD_T)
    loss.backward()
    assert float(loss.detach()) == 0.0 and logits.grad is not None and not logits.grad.any()


def test_only_the_best_window_of_each_word_gets_a_gradient() -> None:
    k = 4
    logits = torch.randn(1, 20, 12, generator=torch.Generator().manual_seed(5))  # no ties
    logits[0, 12, 3] = 5.0  # the word's posterior peaks around frame 12
    logits.requires_grad_(True)
    t = torch.full((1, 20), SIL)
    t[0, 8:18] = 3
    peak_span_loss(smoothed_softmax(logits, k), t, WORD_T).backward()
    touched = torch.nonzero(logits.grad[0].abs().sum(-1)).flatten().tolist()
    sm = smoothed(torch.softmax(logits.detach(), -1), k)[0, 8:18, 3]
    best = 8 + int(sm.argmax())
    assert touched == list(range(best - k + 1, best + 1))


def test_descending_the_loss_lifts_the_peak_to_the_threshold() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(1, 30, 12, generator=gen) * 0.1).requires_grad_(True)
    t = torch.full((1, 30), SIL)
    t[0, 10:25] = 6
    opt = torch.optim.SGD([logits], lr=5.0)
    for _ in range(60):
        opt.zero_grad()
        peak_span_loss(smoothed_softmax(logits, 15), t, WORD_T).backward()
        opt.step()
    peak = smoothed(torch.softmax(logits.detach(), -1), 15)[0, 10:25, 6].max()
    assert float(peak) > 0.86


@pytest.mark.parametrize(
    ("cfg", "msg"),
    [
        (PeakLossConfig(weight=-0.5), "--peak-loss-weight"),
        (PeakLossConfig(weight=1.0, smooth_frames=0), "--peak-smooth"),
    ],
)
def test_bad_settings_are_refused(cfg: PeakLossConfig, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        cfg.check()


def test_the_recipe_refuses_a_negative_weight() -> None:
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe

    with pytest.raises(ValueError, match="--peak-loss-weight must be >= 0"):
        KWSRecipe(KWSOptions(peak_loss_weight=-1.0), ModelOptions(), TrainConfig())
    with pytest.raises(ValueError, match="--false-peak-loss-weight must be >= 0"):
        KWSRecipe(KWSOptions(false_peak_loss_weight=-1.0), ModelOptions(), TrainConfig())


def test_the_recipe_adds_the_weighted_peak_loss_to_the_frame_loss() -> None:
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe

    small = ModelOptions(d_model=8, d_state=4, n_layers=1)
    plain = KWSRecipe(KWSOptions(vtlp=False), small, TrainConfig())
    opts = KWSOptions(vtlp=False, peak_loss_weight=0.5, false_peak_loss_weight=0.25)
    peaked = KWSRecipe(opts, small, TrainConfig())
    model = plain.build_model()
    gen = torch.Generator().manual_seed(0)
    audio = torch.randn(2, 16000, generator=gen) * 0.1
    targets = random_targets(gen, 2, 50)
    no_word = torch.full_like(targets, -100)
    no_phones = torch.zeros(2, MAX_PHONES, dtype=torch.long)
    batch = KWSItem(
        audio,
        targets,
        torch.ones(2),
        no_word,
        no_word,
        no_phones,
        torch.full((2,), -1),
        torch.full((2,), -1),
        targets,
    )
    base, n = plain.loss(model, batch, torch.device("cpu"))
    both, _ = peaked.loss(model, batch, torch.device("cpu"))
    with torch.no_grad():
        logits = model(audio)
        sm = smoothed_softmax(logits, 15)
        peak = peak_span_loss(sm, targets, WORD_T)
        false = false_peak_loss(sm, targets, torch.tensor(REJECT), torch.tensor(COMMANDS))
    assert n == 2 and float(peak) > 0 and float(false) > 0
    gap = float((both - base).detach())
    assert abs(gap - 0.5 * float(peak) - 0.25 * float(false)) < 1e-5
