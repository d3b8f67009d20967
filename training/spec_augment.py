"""SpecAugment for the log-mel front end: random mel bands and frame spans masked while training.

Park et al. (2019): masking a few consecutive frequency channels and time steps of the input
features regularises a speech model. Here it targets what limits the keyword spotter: with a
few dozen synthetic speakers the model leans on the exact formant bands of the voices it saw,
and a masked band forces it to recognise the word from the rest of the spectrum.

The masks come from ``torchaudio.functional.mask_along_axis_iid`` (one independent span per
window and call; widths uniform in [0, width)). Masked features take the window's own mean, so
a mask neither adds silence nor energy. Training only: the served front end never masks, so
nothing of the runtime changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torchaudio.functional as AF


@dataclass(frozen=True)
class SpecAugmentConfig:
    freq_masks: int = 0  # mel-band spans masked per window
    freq_mask_width: int = 7  # each at most this many bands (exclusive)
    time_masks: int = 0  # frame spans masked per window
    time_mask_width: int = 5  # each at most this many frames (exclusive)

    @property
    def active(self) -> bool:
        return (self.freq_masks > 0 and self.freq_mask_width > 1) or (
            self.time_masks > 0 and self.time_mask_width > 1
        )

    def check(self, n_mels: int) -> None:
        """Refuse settings that could mask nothing useful or everything."""
        for name, v in vars(self).items():
            if v < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {v}")
        if self.freq_masks and self.freq_mask_width > n_mels:
            raise ValueError(
                f"--freq-mask-width {self.freq_mask_width} exceeds the {n_mels} mel bands"
            )


def spec_augment(feats: torch.Tensor, cfg: SpecAugmentConfig) -> torch.Tensor:
    """Features (B, T, M) -> the same with masked bands and frame spans (a new tensor)."""
    if not cfg.active or feats.numel() == 0:
        return feats
    keep = feats.new_ones(feats.shape[0], 1, feats.shape[2], feats.shape[1])  # (B, 1, M, T)
    if cfg.freq_mask_width > 1:
        for _ in range(cfg.freq_masks):
            keep = AF.mask_along_axis_iid(keep, cfg.freq_mask_width, 0.0, axis=2)
    if cfg.time_mask_width > 1:
        for _ in range(cfg.time_masks):
            keep = AF.mask_along_axis_iid(keep, cfg.time_mask_width, 0.0, axis=3)
    keep = keep.squeeze(1).transpose(1, 2) > 0  # (B, T, M), torchaudio's layout undone
    mean = feats.mean(dim=(1, 2), keepdim=True)  # (B, 1, 1)
    return torch.where(keep, feats, mean)
