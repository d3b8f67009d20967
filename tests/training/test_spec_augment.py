"""SpecAugment masks: whole spans of bands and frames, filled with the window's mean, per window."""

from __future__ import annotations

import pytest
import torch

from training.spec_augment import SpecAugmentConfig, spec_augment


def _masked(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x != y  # (B, T, M) True where a mask changed the value


def test_inactive_config_is_the_identity() -> None:
    x = torch.randn(3, 50, 40)
    assert spec_augment(x, SpecAugmentConfig()) is x
    assert spec_augment(x, SpecAugmentConfig(freq_masks=2, freq_mask_width=1)) is x


def test_frequency_masks_are_whole_band_spans_at_the_window_mean() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 50, 40, dtype=torch.float64)
    y = spec_augment(x, SpecAugmentConfig(freq_masks=1, freq_mask_width=8))
    changed = _masked(x, y)
    bands = changed.all(dim=1)  # (B, M): a masked band is masked at every frame
    assert torch.equal(changed, bands.unsqueeze(1).expand_as(changed))
    widths = bands.sum(-1)
    assert int(widths.max()) <= 7 and int(widths.min()) >= 0
    assert len(set(widths.tolist())) > 2  # widths vary per window
    for b in range(len(x)):
        idx = bands[b].nonzero().squeeze(-1)
        if len(idx):
            assert int(idx[-1] - idx[0]) + 1 == len(idx)  # one contiguous span
            assert torch.allclose(y[b][:, idx], x[b].mean().expand(50, len(idx)))


def test_time_masks_cover_frames_of_every_band() -> None:
    torch.manual_seed(1)
    x = torch.randn(32, 60, 40)
    y = spec_augment(x, SpecAugmentConfig(time_masks=2, time_mask_width=6))
    changed = _masked(x, y)
    frames = changed.any(dim=2)  # (B, T)
    assert torch.equal(changed, frames.unsqueeze(2).expand_as(changed))
    assert int(frames.sum(-1).max()) <= 10 and bool(frames.any())
    assert y.shape == x.shape and not torch.equal(x, y)


def test_seeded_masks_repeat() -> None:
    x = torch.randn(8, 30, 40)
    cfg = SpecAugmentConfig(freq_masks=2, time_masks=2)
    torch.manual_seed(5)
    a = spec_augment(x, cfg)
    torch.manual_seed(5)
    assert torch.equal(a, spec_augment(x, cfg))


@pytest.mark.parametrize(
    ("cfg", "msg"),
    [
        (SpecAugmentConfig(freq_masks=-1), "--freq-masks must be >= 0"),
        (SpecAugmentConfig(freq_masks=1, freq_mask_width=41), "exceeds the 40 mel bands"),
    ],
)
def test_bad_settings_are_refused(cfg: SpecAugmentConfig, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        cfg.check(40)
