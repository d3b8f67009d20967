"""training.data.audio.resample keeps one torchaudio resampler per pair of rates: its values
must stay exactly those of torchaudio.functional.resample, so cached corpora and seeded
augmentation are unchanged by the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchaudio.functional as AF

from training.data.audio import change_speed, resample


@pytest.mark.parametrize(
    "orig,new", [(16000, 8000), (8000, 16000), (22050, 16000), (24000, 16000), (97, 100)]
)
def test_cached_resampler_equals_the_functional_form_exactly(orig, new):
    x = np.random.default_rng(orig).standard_normal(4000).astype(np.float32)
    want = AF.resample(torch.from_numpy(x), orig, new).numpy()
    for _ in range(2):  # the first call builds the resampler, the second reuses it
        got = resample(x, orig, new)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def test_speed_change_and_same_rate():
    x = np.random.default_rng(0).standard_normal(1600).astype(np.float32)
    np.testing.assert_array_equal(resample(x, 16000, 16000), x)
    np.testing.assert_array_equal(
        change_speed(x, 1.1), AF.resample(torch.from_numpy(x), 110, 100).numpy()
    )
