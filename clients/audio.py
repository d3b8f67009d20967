"""Audio helpers for the speech client: read files, convert to wire PCM, cut into chunks.

The wire formats are those of ``WS /v1/speech/stream``: mono little-endian 16-bit integers
(``pcm_s16le``) or 32-bit floats (``pcm_f32le``) at any sample rate the ``start`` message names.
WAV is read with the standard library; FLAC/OGG and other formats need ``soundfile``.
"""

from __future__ import annotations

import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ENCODINGS", "AudioClip", "chunk_pcm", "read_audio", "to_pcm_bytes"]

#: bytes per sample of each wire encoding.
ENCODINGS: dict[str, int] = {"pcm_s16le": 2, "pcm_f32le": 4}


@dataclass(frozen=True)
class AudioClip:
    """Mono audio: float32 samples in [-1, 1] and their sample rate."""

    samples: np.ndarray  # (T,) float32
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / float(self.sample_rate)


def _read_wav_stdlib(path: Path) -> AudioClip:
    with wave.open(str(path), "rb") as w:
        width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
        raw = w.readframes(w.getnframes())
    if width == 2:
        x = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 1:
        x = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 4:
        x = np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    else:
        raise ValueError(f"{path}: unsupported WAV sample width {width} bytes")
    x = x.reshape(-1, channels).mean(axis=1)  # (T,) mono
    return AudioClip(x.astype(np.float32), rate)


def read_audio(path: str | Path) -> AudioClip:
    """Read a WAV/FLAC/... file as mono float32; raises ValueError with the reason if it cannot."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    try:
        import soundfile as sf
    except ImportError:  # WAV still works without soundfile
        sf = None
    if sf is not None:
        try:
            data, rate = sf.read(str(p), dtype="float32", always_2d=True)  # (T, C)
        except Exception as exc:  # soundfile raises its own LibsndfileError / RuntimeError
            raise ValueError(f"{p}: cannot read audio: {exc}") from exc
        return AudioClip(data.mean(axis=1).astype(np.float32), int(rate))
    try:
        return _read_wav_stdlib(p)
    except (wave.Error, EOFError) as exc:
        raise ValueError(
            f"{p}: cannot read audio (install soundfile for non-WAV files): {exc}"
        ) from exc


def to_pcm_bytes(samples: np.ndarray | bytes, encoding: str = "pcm_s16le") -> bytes:
    """Encode float samples in [-1, 1] (or int16 samples) as wire PCM; bytes pass through."""
    if isinstance(samples, bytes | bytearray | memoryview):
        return bytes(samples)
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; use one of {sorted(ENCODINGS)}")
    x = np.asarray(samples)
    if x.ndim != 1:
        raise ValueError(f"expected mono samples of shape (T,), got {x.shape}")
    if encoding == "pcm_s16le":
        if x.dtype == np.int16:
            return x.astype("<i2").tobytes()
        y = np.clip(np.nan_to_num(x.astype(np.float32)), -1.0, 1.0)
        return np.round(y * 32767.0).astype("<i2").tobytes()
    if x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    return np.asarray(x, dtype="<f4").tobytes()


def chunk_pcm(
    clip: AudioClip, chunk_ms: float, encoding: str = "pcm_s16le"
) -> Iterator[tuple[bytes, float]]:
    """Cut a clip into wire chunks of ``chunk_ms``; yields (payload, chunk duration in s)."""
    if chunk_ms <= 0:
        raise ValueError(f"chunk_ms must be > 0, got {chunk_ms}")
    n = max(1, int(round(clip.sample_rate * chunk_ms / 1000.0)))
    for start in range(0, len(clip.samples), n):
        piece = clip.samples[start : start + n]  # (<=n,)
        yield to_pcm_bytes(piece, encoding), len(piece) / clip.sample_rate
