"""Waveform utilities for keyword clips: resampling, silence trimming, windowing, augmentation.

All random choices are drawn from an explicit ``numpy.random.Generator`` so callers control
determinism.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torchaudio.transforms as AT

from training.data.labels import CLIP_SAMPLES, SAMPLE_RATE


@dataclass(frozen=True)
class AugmentConfig:
    """On-the-fly augmentation applied to a clean keyword clip before it is windowed."""

    # Probability of applying the speed change below (changes tempo and pitch together).
    speed_prob: float = 0.8
    # Maximum relative speed change; the factor is drawn from [1 - speed_max, 1 + speed_max].
    speed_max: float = 0.10
    # Range (dB) of the gain applied to the peak-normalised clean clip.
    gain_db: tuple[float, float] = (-18.0, 0.0)
    # Probability of mixing in synthetic background noise.
    noise_prob: float = 0.8
    # Range (dB) of the speech-to-noise ratio when noise is added.
    snr_db: tuple[float, float] = (5.0, 30.0)
    # Range of the spectral slope exponent of the noise (0 white, 1 pink, 2 brown).
    noise_color: tuple[float, float] = (0.0, 2.0)


@functools.lru_cache(maxsize=256)
def _resampler(orig_rate: int, new_rate: int) -> AT.Resample:
    """torchaudio's resampler for one pair of rates; it builds its sinc kernel once (the
    functional form rebuilds it per call, which was a sixth of a training window's cost)."""
    return AT.Resample(orig_rate, new_rate, dtype=torch.float32)  # float32 as the functional


def resample(audio: np.ndarray, orig_rate: int, new_rate: int) -> np.ndarray:
    """Band-limited resampling of a 1-D float32 signal (``torchaudio``'s sinc interpolation,
    the same values as ``torchaudio.functional.resample``)."""
    if orig_rate == new_rate:
        return np.asarray(audio, dtype=np.float32)
    with torch.no_grad():
        out = _resampler(orig_rate, new_rate)(
            torch.from_numpy(np.ascontiguousarray(audio, np.float32))
        )
    return out.numpy().astype(np.float32, copy=False)


def trim_silence(
    audio: np.ndarray, rate: int = SAMPLE_RATE, top_db: float = 40.0, margin_s: float = 0.02
) -> np.ndarray:
    """Drop leading/trailing frames whose RMS is more than ``top_db`` below the loudest frame."""
    frame = max(1, int(rate * 0.01))
    n_frames = len(audio) // frame
    if n_frames == 0:
        return audio
    frames = audio[: n_frames * frame].reshape(n_frames, frame)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
    peak = rms.max()
    if peak <= 0:
        return audio[:0]
    active = np.flatnonzero(rms >= peak * 10.0 ** (-top_db / 20.0))
    margin = int(rate * margin_s)
    start = max(0, active[0] * frame - margin)
    stop = min(len(audio), (active[-1] + 1) * frame + margin)
    return audio[start:stop]


def peak_normalize(audio: np.ndarray, peak: float = 0.9) -> np.ndarray:
    """Scale ``audio`` so that its maximum absolute value is ``peak`` (silence is returned as is)."""
    m = float(np.max(np.abs(audio))) if audio.size else 0.0
    return audio if m == 0.0 else (audio * (peak / m)).astype(np.float32)


def place_in_window(
    audio: np.ndarray,
    rng: np.random.Generator | None = None,
    length: int = CLIP_SAMPLES,
) -> np.ndarray:
    """Put ``audio`` at a random offset inside a zero window of ``length`` samples.

    Clips longer than the window are cropped at a random start. With ``rng=None`` the clip is
    centred (or centre-cropped) instead.
    """
    out = np.zeros(length, dtype=np.float32)
    n = len(audio)
    if n >= length:
        start = (n - length) // 2 if rng is None else int(rng.integers(0, n - length + 1))
        out[:] = audio[start : start + length]
        return out
    offset = (length - n) // 2 if rng is None else int(rng.integers(0, length - n + 1))
    out[offset : offset + n] = audio
    return out


def change_speed(audio: np.ndarray, factor: float) -> np.ndarray:
    """Play ``audio`` ``factor`` times faster (tempo and pitch), quantised to 1 % steps."""
    num = int(round(100 * factor))
    if num == 100:
        return audio
    # Reading num input samples per 100 output samples shortens the signal by ``factor``.
    return resample(audio, num, 100)


def colored_noise(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Unit-RMS noise whose power spectrum falls as ``1 / f**exponent``."""
    spec = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n)
    freqs[0] = freqs[1] if n > 1 else 1.0
    spec *= freqs ** (-exponent / 2.0)
    noise = np.fft.irfft(spec, n)
    rms = float(np.sqrt(np.mean(noise**2)))
    return (noise / rms if rms > 0 else noise).astype(np.float32)


def augment_clip(
    clean: np.ndarray,
    config: AugmentConfig,
    rng: np.random.Generator,
    length: int = CLIP_SAMPLES,
) -> np.ndarray:
    """Speed-perturb, gain, window at a random offset and add background noise; clip to [-1, 1]."""
    audio = clean
    if rng.random() < config.speed_prob and config.speed_max > 0:
        audio = change_speed(audio, 1.0 + rng.uniform(-config.speed_max, config.speed_max))
    audio = peak_normalize(audio) * np.float32(10.0 ** (rng.uniform(*config.gain_db) / 20.0))
    window = place_in_window(audio, rng, length)
    if rng.random() < config.noise_prob:
        # SNR is measured against the power of the (possibly cropped) speech itself.
        kept = audio[: min(len(audio), length)].astype(np.float64)
        signal_power = float(np.mean(kept**2)) if kept.size else 0.0
        snr = rng.uniform(*config.snr_db)
        noise = colored_noise(length, rng.uniform(*config.noise_color), rng)
        window = window + noise * np.float32(np.sqrt(signal_power / 10.0 ** (snr / 10.0)))
    return np.clip(window, -1.0, 1.0).astype(np.float32)
