"""Keyword-spotting test material: espeak-ng words with pauses (and where each one is), voiced
test signals, and a tiny random SC12-style model with a detection operating point."""

from __future__ import annotations

import io
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest
import soundfile as sf
import torch
from scipy.signal import resample_poly

from dlr_runtime import DLRConfig, DLRModel, save_checkpoint
from dlr_runtime.speech_embedding import EMBED_STRIDE, EMBED_WINDOW

RATE = 16000
NAME = "tiny-kws"
LABELS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
LABELS += ["_silence_", "_unknown_"]
DETECTION = {"threshold": 0.3, "smooth_ms": 50.0, "refractory_ms": 300.0}


def write_kws_model(
    root, frame_window: int = 0, frontend: str = "logmel", unknown_classes: int = 0
) -> None:
    """The tiny model as `root / NAME`; `frame_window` 320: overlapping 20 ms log-mel windows
    every 10 ms frame (the state keeps the samples before each frame); `frontend`
    "speech_embedding": the frozen speech embedding instead, with its own framing (80 ms frames,
    0.78 s windows); `unknown_classes`: the last label the union of that many classes
    (dlr_runtime/unknown_head.py)."""
    framing = {"frame_stride": 160, "frame_window": frame_window}
    if frontend == "speech_embedding":
        framing = {"frame_stride": EMBED_STRIDE, "frame_window": EMBED_WINDOW}
    cfg = DLRConfig(
        d_model=16, d_state=8, n_layers=2, encoder="audio", decoder="classifier",
        labels=LABELS, frontend=frontend, n_mels=16, pool_window_s=0.5,
        dt_min=0.01, dt_max=0.5, sample_rate=RATE, unknown_classes=unknown_classes, **framing,
    )  # fmt: skip
    torch.manual_seed(0)
    m = DLRModel(cfg, seed=5)
    with torch.no_grad():
        m.head.proj.weight.mul_(8.0)
    save_checkpoint(m, root / NAME, detection=DETECTION)


COMMANDS = ["go", "stop", "left", "yes", "down"]
MIXED = ["go", "house", "stop", "table", "left", "yes", "window", "down"]  # 3 non-commands


@dataclass(frozen=True)
class Spoken:
    word: str
    start_ms: float
    end_ms: float


def say(word: str, voice: str = "en-us") -> np.ndarray:
    """One word from espeak-ng at 16 kHz (float32)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed")
    out = subprocess.run(
        ["espeak-ng", "-v", voice, "--stdout", word], capture_output=True, check=True, timeout=30
    ).stdout
    x, sr = sf.read(io.BytesIO(out), dtype="float32")
    return resample_poly(x, RATE, sr).astype(np.float32)


def spoken_stream(
    words: list[str], pause_s: float = 1.0, lead_s: float = 0.5
) -> tuple[np.ndarray, list[Spoken]]:
    """The words with `pause_s` of quiet room noise between them (and `lead_s` before)."""
    rng = np.random.default_rng(0)
    t = int(RATE * lead_s)
    parts, where = [np.zeros(t, np.float32)], []
    for w in words:
        x = 0.8 * say(w)
        where.append(Spoken(w, t / RATE * 1000, (t + x.size) / RATE * 1000))
        parts += [x, np.zeros(int(RATE * pause_s), np.float32)]
        t += x.size + int(RATE * pause_s)
    x = np.concatenate(parts)
    return x + (1e-4 * rng.standard_normal(x.size)).astype(np.float32), where


def words() -> np.ndarray:
    """Five voiced 'words' (sawtooth at several pitches) between quiet gaps, 8 s."""
    rng = np.random.default_rng(7)
    parts = []
    for f0, dur, gap in [(120, 0.5, 0.8), (200, 0.4, 1.2), (160, 0.6, 0.9), (260, 0.3, 1.0)]:
        parts.append(1e-4 * rng.standard_normal(int(RATE * gap)))
        t = np.arange(int(RATE * dur)) / RATE
        parts.append(0.3 * ((t * f0) % 1 - 0.5) * np.hanning(t.size))
    parts.append(1e-4 * rng.standard_normal(int(RATE * 1.5)))
    return np.concatenate(parts).astype(np.float32)
