"""Test audio for keyword spotting: espeak-ng words with pauses, and where each one is."""

from __future__ import annotations

import io
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

RATE = 16000
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


def spoken_stream(words: list[str], pause_s: float = 1.0) -> tuple[np.ndarray, list[Spoken]]:
    """The words with `pause_s` of quiet room noise between them (and 0.5 s before)."""
    rng = np.random.default_rng(0)
    parts, where, t = [np.zeros(RATE // 2, np.float32)], [], RATE // 2
    for w in words:
        x = 0.8 * say(w)
        where.append(Spoken(w, t / RATE * 1000, (t + x.size) / RATE * 1000))
        parts += [x, np.zeros(int(RATE * pause_s), np.float32)]
        t += x.size + int(RATE * pause_s)
    x = np.concatenate(parts)
    return x + (1e-4 * rng.standard_normal(x.size)).astype(np.float32), where
