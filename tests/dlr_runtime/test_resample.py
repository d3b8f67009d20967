"""StreamResampler: quality, chunking invariance, bounded cost at awkward rates, state round trip.

References: `torchaudio.functional.resample` in float64 (same kernel: must agree to ~1e-12)
where torchaudio is cheap, and analytic sines (SNR) at any rate, including rates whose gcd
with 16 kHz is 1 (4001, 8001, 44101, 383999), where torchaudio builds a huge kernel.
"""

from __future__ import annotations

import math
import resource
import time

import pytest
import torch
import torchaudio
from hypothesis import given, settings
from hypothesis import strategies as st

from dlr_runtime.engine.resample import (
    DESIGNS,
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    SampleRateError,
    StreamResampler,
)

AWKWARD = [4001, 8001, 44101, 383999]


def run(r: StreamResampler, x: torch.Tensor, cuts: list[int]) -> torch.Tensor:
    pieces, lo = [], 0
    for c in [*sorted(cuts), x.numel()]:
        pieces.append(r.push(x[lo:c]))
        lo = max(lo, c)
    return torch.cat([*pieces, r.flush()])


def sine_snr_db(orig: int, new: int, freq: float, seconds: float = 0.5) -> float:
    """SNR of a resampled sine against the exact sine at the output times (edges excluded)."""
    n_in = int(orig * seconds)
    t_in = torch.arange(n_in, dtype=torch.float64) / orig
    x = torch.sin(2 * math.pi * freq * t_in).to(torch.float32)
    y = run(StreamResampler(orig, new), x, [n_in // 3]).double()
    t_out = torch.arange(y.numel(), dtype=torch.float64) / new
    ref = torch.sin(2 * math.pi * freq * t_out)
    edge = int(0.05 * new)  # the zero padding at both ends is not part of the comparison
    err = (y - ref)[edge:-edge]
    return 10 * math.log10(ref[edge:-edge].pow(2).mean() / err.pow(2).mean())


@pytest.mark.parametrize(
    "orig,new", [(44100, 16000), (48000, 16000), (8000, 16000), (16000, 22050)]
)
def test_equals_torchaudio_float64(orig, new):
    x = torch.randn(orig // 4, generator=torch.Generator().manual_seed(0))  # (L,) 0.25 s
    ref = torchaudio.functional.resample(x.double(), orig, new)
    r = StreamResampler(orig, new)
    got = run(r, x, [1001, 5000])
    assert got.shape == ref.shape
    assert (got.double() - ref).abs().max() < 1e-6  # float32 output of the float64 computation


@pytest.mark.parametrize("orig", [*AWKWARD, 1000, 22050, 48000, MAX_SAMPLE_RATE])
def test_sine_quality(orig):
    """A 440 Hz sine (200 Hz at 1 kHz) resampled to 16 kHz is within 60 dB SNR of the exact
    sine, and 16 kHz -> orig likewise (the hann-windowed sinc of 6 zero crossings)."""
    freq = min(440.0, 0.2 * orig)
    assert sine_snr_db(orig, 16000, freq) > 60
    if orig <= 96000:
        assert sine_snr_db(16000, orig, freq) > 60


@pytest.mark.parametrize("orig", AWKWARD)
def test_awkward_rates_cost_bounded_memory_and_time(orig):
    """Building a resampler for any rate is cheap, and 1 s of audio costs bounded memory (the
    work arrays are (2048, taps)); torchaudio would need ~n * o kernel entries here."""
    DESIGNS.clear()
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    t0 = time.perf_counter()
    r = StreamResampler(orig, 16000)
    built = time.perf_counter() - t0
    x = torch.randn(orig)  # (L,) 1 s
    y = run(r, x, [orig // 7, orig // 2])
    assert y.numel() == math.ceil(orig * 16000 / orig)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak0
    assert grown < 200 * 1024, f"peak RSS grew {grown} KiB"
    assert built < 0.5  # (measured < 1 ms; generous for a shared machine)
    assert DESIGNS.nbytes <= 1 << 20  # no phase table at all for coprime rates


def test_cache_is_bounded_by_bytes():
    DESIGNS.clear()
    for orig in range(1000, 1000 + 200):  # small rates: each has a table
        StreamResampler(orig, 16000)
    assert DESIGNS.nbytes <= DESIGNS.max_bytes


@pytest.mark.parametrize("rate", [0, 999, MAX_SAMPLE_RATE + 1, -16000, 16000.0, True, "16000"])
def test_rates_outside_the_range_raise_sample_rate_error(rate):
    with pytest.raises(SampleRateError, match=f"{MIN_SAMPLE_RATE}|integer"):
        StreamResampler(rate, 16000)


@settings(max_examples=40, deadline=None)
@given(
    orig=st.sampled_from([*AWKWARD[:3], 8000, 44100, 48000, 11025, 1000, 96000]),
    cuts=st.lists(st.integers(0, 6000), max_size=6),
)
def test_chunking_is_exactly_one_shot(orig, cuts):
    x = torch.randn(6000, generator=torch.Generator().manual_seed(orig))
    whole = run(StreamResampler(orig, 16000), x, [])
    assert torch.equal(run(StreamResampler(orig, 16000), x, cuts), whole)


@settings(max_examples=60, deadline=None)
@given(
    orig=st.integers(MIN_SAMPLE_RATE, MAX_SAMPLE_RATE),
    new=st.sampled_from([16000, 8000, 48000, 22050]),
    cuts=st.lists(st.integers(0, 3000), max_size=5),
)
def test_any_rate_pair_chunks_exactly_with_the_right_length(orig, new, cuts):
    x = torch.randn(3000, generator=torch.Generator().manual_seed(orig))
    whole = run(StreamResampler(orig, new), x, [])
    assert whole.numel() == math.ceil(3000 * new / orig)
    assert torch.isfinite(whole).all()
    assert torch.equal(run(StreamResampler(orig, new), x, cuts), whole)


@pytest.mark.parametrize("orig", [44100, 22050, 1000, 48000])
def test_long_and_short_pushes_agree_bitwise(orig):
    """Long pushes take one strided view per kernel phase, short ones gather each window:
    the same outputs either way, to the bit."""
    x = torch.randn(3 * orig, generator=torch.Generator().manual_seed(2))
    whole = run(StreamResampler(orig, 16000), x, [])
    cuts = [1, 2, 5, 100, 101, 5000, orig, orig + 3, 2 * orig]
    assert torch.equal(run(StreamResampler(orig, 16000), x, cuts), whole)
    small = list(range(0, 3 * orig, 97))
    assert torch.equal(run(StreamResampler(orig, 16000), x, small), whole)


@pytest.mark.parametrize("orig", [44100, 4001, 16000])
def test_state_round_trip_continues_exactly(orig):
    x = torch.randn(orig // 2, generator=torch.Generator().manual_seed(1))
    whole = run(StreamResampler(orig, 16000), x, [777])
    a = StreamResampler(orig, 16000)
    head = a.push(x[:777])
    b = StreamResampler.from_state(a.state_dict())
    assert torch.equal(torch.cat([head, b.push(x[777:]), b.flush()]), whole)


def test_bad_states_are_refused_naming_the_field():
    good = StreamResampler(4001, 16000)
    good.push(torch.randn(500))
    d = good.state_dict()
    for key, value, why in [
        ("orig", 10**9, "orig"),
        ("orig", float("inf"), "orig"),
        ("received", -1, "received"),
        ("next", "7", "next"),
        ("start", 2.5, "start"),
        ("buf", "***", "base64"),
        ("received", d["received"] + 4, "received"),
        ("start", d["start"] + 1, "received|needed"),
    ]:
        with pytest.raises(ValueError, match=why):
            StreamResampler.from_state({**d, key: value})
    with pytest.raises(ValueError, match="orig|new"):
        StreamResampler.from_state({"orig": 44100})
