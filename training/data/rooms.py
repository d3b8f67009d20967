"""Augmentation that moves clean synthetic speech toward a real room and microphone.

Choices (each drawn from an explicit ``numpy.random.Generator``, so an item is reproducible
from (seed, epoch, index)):

- Room reverberation: impulse responses of random shoebox rooms (3-10 m, RT60 0.15-0.9 s,
  random source/microphone positions) simulated once with **pyroomacoustics**' image-source
  method and cached on disk (:func:`rir_bank`); applied with ``scipy.signal.fftconvolve``.
- Speed perturbation (tempo + pitch + formants together, 0.85-1.15): band-limited resampling
  with **torchaudio** (``audio.change_speed``). Formant-only warping (VTLP) is done on the
  power spectrum in the training recipe, where it is a matmul.
- Microphone/channel: telephone band (300-3400 Hz, 4th-order Butterworth, half of the time
  through 8 kHz and back, half of those through a G.711 mu-law round trip with
  ``torchaudio.functional``), random low-pass (2-7 kHz) or high-pass (80-400 Hz) with
  **scipy.signal**. Lossy MP3 / Opus round trips through ffmpeg: in bulk, one ffmpeg run per
  voice, cached (``codecs.py``, with the recipe's ``--codecs``); a word is taken from its coded
  copy with ``codec_prob``.
- Background: noise of several colours (white..brown, ``audio.colored_noise``), hum
  (50/60 Hz and harmonics), babble (other synthesized words mixed at random times), digital
  near-silence; gain from whisper-quiet (-45 dBFS) to clipping (+10 dB, hard clip).

audiomentations was considered for the noise/filter/clipping steps; it draws from numpy's
global random state, so per-item determinism would need global reseeding in every worker. The
primitives above take a Generator instead and are what audiomentations calls underneath.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchaudio.functional as AF
from scipy import signal

from training.data.audio import change_speed, colored_noise, resample
from training.data.labels import SAMPLE_RATE


@dataclass(frozen=True)
class RoomConfig:
    """Probabilities and ranges of the per-word and per-window augmentation."""

    speed_prob: float = 0.7  # resample-based speed change
    speed: tuple[float, float] = (0.85, 1.15)
    reverb_prob: float = 0.5  # convolve the word with a room impulse response
    telephone_prob: float = 0.15  # 300-3400 Hz band (half of them through 8 kHz)
    lowpass_prob: float = 0.15  # random low-pass corner in lowpass_hz
    lowpass_hz: tuple[float, float] = (2000.0, 7000.0)
    highpass_prob: float = 0.1  # random high-pass corner in highpass_hz
    highpass_hz: tuple[float, float] = (80.0, 400.0)
    snr_db: tuple[float, float] = (0.0, 30.0)  # speech-to-background ratio
    silence_dbfs: tuple[float, float] = (-70.0, -15.0)  # background level of word-less windows
    peak_dbfs: tuple[float, float] = (-45.0, 0.0)  # window peak level before clipping
    clip_prob: float = 0.05  # drive the window 0-10 dB into hard clipping
    codec_prob: float = 0.25  # a word from its MP3 / Opus copy (where the pool has them)


def rir_bank(
    cache_dir: str | os.PathLike, n: int = 64, seed: int = 0, max_len: int = 8000
) -> list[np.ndarray]:
    """``n`` room impulse responses (float32, peak-normalised direct path), cached in a .npz."""
    path = Path(cache_dir) / f"rirs-{n}-{seed}-{max_len}.npz"
    if path.exists():
        with np.load(path) as d:
            return [d[f"r{i}"] for i in range(n)]
    import pyroomacoustics as pra

    rng = np.random.default_rng([seed, 0xA11])
    out = []
    while len(out) < n:
        dims = rng.uniform([3.0, 3.0, 2.4], [10.0, 8.0, 4.0])
        rt60 = rng.uniform(0.15, 0.9)
        try:
            absorption, max_order = pra.inverse_sabine(rt60, dims)
        except ValueError:
            continue
        room = pra.ShoeBox(
            dims, fs=SAMPLE_RATE, materials=pra.Material(absorption), max_order=min(max_order, 12)
        )
        src = rng.uniform(0.5, dims - 0.5)
        mic = rng.uniform(0.5, dims - 0.5)
        room.add_source(src)
        room.add_microphone(mic)
        room.compute_rir()
        rir = np.asarray(room.rir[0][0], np.float64)[:max_len]
        rir = rir / (np.max(np.abs(rir)) + 1e-9)
        out.append(rir.astype(np.float32))
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **{f"r{i}": r for i, r in enumerate(out)})
    os.replace(tmp, path)
    return out


@functools.lru_cache(maxsize=256)
def _sos_cached(kind: str, hz: tuple[int, ...], order: int) -> np.ndarray:
    return signal.butter(
        order, hz if len(hz) > 1 else hz[0], btype=kind, fs=SAMPLE_RATE, output="sos"
    )


def _sos(kind: str, hz, order: int = 4) -> np.ndarray:
    """Butterworth sections, corners rounded to 50 Hz so designs are cached."""
    corners = tuple(int(round(f / 50) * 50) for f in np.atleast_1d(hz))
    return _sos_cached(kind, corners, order)


NOISE_COLOURS = (0.0, 0.5, 1.0, 1.5, 2.0)  # spectral slope exponents of the noise bank


@functools.lru_cache(maxsize=1)
def noise_bank(seconds: int = 20) -> dict[str, np.ndarray]:
    """Long unit-RMS noises of every colour and hum variants, cropped at random per window."""
    rng = np.random.default_rng(0xB0B)
    n = seconds * SAMPLE_RATE
    bank = {f"noise{e}": colored_noise(n, e, rng) for e in NOISE_COLOURS}
    for k in range(6):
        bank[f"hum{k}"] = _hum(4 * SAMPLE_RATE, rng, 50.0 if k % 2 else 60.0)
    return bank


def _crop(x: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    if len(x) < n:
        x = np.tile(x, n // len(x) + 1)
    s = int(rng.integers(0, len(x) - n + 1))
    sign = np.float32(1.0 if rng.random() < 0.5 else -1.0)
    return x[s : s + n] * sign


def colour(n: int, rng: np.random.Generator, exponent: float | None = None) -> np.ndarray:
    """Unit-RMS noise of a random (or given) colour from the bank."""
    e = NOISE_COLOURS[int(rng.integers(len(NOISE_COLOURS)))] if exponent is None else exponent
    return _crop(noise_bank()[f"noise{e}"], n, rng)


def word_effects(
    word: np.ndarray, cfg: RoomConfig, rirs: list[np.ndarray], rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """Speed + reverb of one clean word; returns (audio, samples of speech before the tail)."""
    a = word
    if rng.random() < cfg.speed_prob:
        a = change_speed(a, float(rng.uniform(*cfg.speed)))
    speech_len = len(a)
    if rirs and rng.random() < cfg.reverb_prob:
        rir = rirs[int(rng.integers(len(rirs)))]
        wet = signal.fftconvolve(a, rir)[: len(a) + len(rir) // 2]
        a = (wet / (np.max(np.abs(wet)) + 1e-9) * np.max(np.abs(a))).astype(np.float32)
    return a.astype(np.float32), speech_len


def channel(x: np.ndarray, cfg: RoomConfig, rng: np.random.Generator) -> np.ndarray:
    """Microphone / transmission band of a whole window."""
    u = rng.random()
    if u < cfg.telephone_prob:
        y = signal.sosfilt(_sos("bandpass", [300.0, 3400.0]), x)
        if rng.random() < 0.5:  # narrowband: 8 kHz, G.711 mu-law round trip half the time
            nb = resample(y.astype(np.float32), SAMPLE_RATE, 8000)
            if rng.random() < 0.5:
                nb = mu_law(nb)
            y = resample(nb, 8000, SAMPLE_RATE)
        return np.asarray(y, np.float32)[: len(x)]
    u -= cfg.telephone_prob
    if u < cfg.lowpass_prob:
        return signal.sosfilt(_sos("lowpass", float(rng.uniform(*cfg.lowpass_hz))), x).astype(
            np.float32
        )
    u -= cfg.lowpass_prob
    if u < cfg.highpass_prob:
        hz = float(rng.uniform(*cfg.highpass_hz))
        return signal.sosfilt(_sos("highpass", hz, 2), x).astype(np.float32)
    return x


def mu_law(x: np.ndarray) -> np.ndarray:
    """G.711 mu-law (8 bit) encode + decode with torchaudio."""
    t = torch.from_numpy(np.clip(x, -1, 1).astype(np.float32))
    return AF.mu_law_decoding(AF.mu_law_encoding(t, 256), 256).numpy().astype(np.float32)


def hum(n: int, rng: np.random.Generator) -> np.ndarray:
    """Mains hum (50 or 60 Hz and a few harmonics), unit RMS, from the bank."""
    return _crop(noise_bank()[f"hum{int(rng.integers(6))}"], n, rng)


def _hum(n: int, rng: np.random.Generator, f0: float) -> np.ndarray:
    t = np.arange(n) / SAMPLE_RATE
    y = np.zeros(n)
    for k in range(1, 6):
        y += rng.uniform(0, 1.0 / k) * np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 2 * np.pi))
    return (y / (np.sqrt(np.mean(y**2)) + 1e-9)).astype(np.float32)


def background(
    n: int, rng: np.random.Generator, babble_words: list[np.ndarray] | None
) -> np.ndarray:
    """Unit-RMS background of ``n`` samples: coloured noise, hum, babble or a mix."""
    kind = rng.random()
    if kind < 0.1:  # near digital silence: faint white noise (dither)
        return colour(n, rng, 0.0)
    if kind < 0.5:
        y = colour(n, rng)
    elif kind < 0.6:
        y = hum(n, rng) + 0.3 * colour(n, rng, 1.0)
    else:
        y = babble(n, rng, babble_words) if babble_words else colour(n, rng, 1.0)
        if rng.random() < 0.5:
            y = y + float(rng.uniform(0.05, 0.5)) * colour(n, rng)
    return (y / (np.sqrt(np.mean(y.astype(np.float64) ** 2)) + 1e-9)).astype(np.float32)


def babble(n: int, rng: np.random.Generator, words: list[np.ndarray]) -> np.ndarray:
    """3-8 overlapping talkers, each a run of random words, summed (unit-free)."""
    y = np.zeros(n, np.float32)
    for _ in range(int(rng.integers(3, 9))):
        pos = int(rng.integers(-SAMPLE_RATE // 2, SAMPLE_RATE // 4))
        gain = float(rng.uniform(0.3, 1.0))
        while pos < n:
            w = words[int(rng.integers(len(words)))]
            s, e = max(0, pos), min(n, pos + len(w))
            if e > s:
                y[s:e] += gain * w[s - pos : e - pos]
            pos += len(w) + int(rng.integers(0, SAMPLE_RATE // 5))
    return y


def level(x: np.ndarray, cfg: RoomConfig, rng: np.random.Generator) -> np.ndarray:
    """Scale a window to a random peak level, sometimes into hard clipping."""
    peak = float(np.max(np.abs(x))) + 1e-9
    db = float(rng.uniform(*cfg.peak_dbfs))
    if rng.random() < cfg.clip_prob:
        db = float(rng.uniform(0.0, 10.0))
    y = x * np.float32(10 ** (db / 20) / peak)
    return np.clip(y, -1.0, 1.0).astype(np.float32)
