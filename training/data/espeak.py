"""Thin wrapper around the ``espeak-ng`` command-line synthesizer.

Runs ``espeak-ng --stdout`` in a subprocess and decodes the 16-bit mono WAV it writes
(22050 Hz) into a float32 numpy array. Nothing here depends on torch.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

import numpy as np

#: Name of the executable looked up on ``PATH``.
ESPEAK_EXECUTABLE = "espeak-ng"

#: Native output sample rate of espeak-ng voices.
ESPEAK_SAMPLE_RATE = 22_050

_INSTALL_HINT = "install it with `apt-get install espeak-ng` (Debian/Ubuntu package 'espeak-ng')"


class EspeakNotFoundError(RuntimeError):
    """Raised when the ``espeak-ng`` executable is not available on ``PATH``."""


class EspeakError(RuntimeError):
    """Raised when ``espeak-ng`` fails or produces unusable output."""


def find_espeak() -> str:
    """Return the path of the ``espeak-ng`` executable or raise :class:`EspeakNotFoundError`."""
    path = shutil.which(ESPEAK_EXECUTABLE)
    if path is None:
        raise EspeakNotFoundError(
            f"the '{ESPEAK_EXECUTABLE}' executable was not found on PATH; {_INSTALL_HINT}"
        )
    return path


def espeak_version() -> str:
    """Return the first line of ``espeak-ng --version`` (used to key on-disk caches)."""
    return _version_of(find_espeak())


@functools.lru_cache(maxsize=8)
def _version_of(executable: str) -> str:
    out = subprocess.run([executable, "--version"], capture_output=True, check=True, timeout=30)
    return out.stdout.decode("utf-8", errors="replace").strip().splitlines()[0]


def decode_wav_pcm16(data: bytes) -> tuple[np.ndarray, int]:
    """Decode a mono 16-bit PCM RIFF/WAVE byte string into ``(float32 samples, sample_rate)``.

    espeak-ng streams to stdout with placeholder chunk sizes, so the ``data`` chunk is taken to
    extend to the end of the buffer instead of trusting its declared length.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise EspeakError("espeak-ng output is not a RIFF/WAVE stream")
    pos = 12
    rate = channels = bits = None
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        size = int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = pos + 8
        if chunk_id == b"fmt ":
            channels = int.from_bytes(data[body + 2 : body + 4], "little")
            rate = int.from_bytes(data[body + 4 : body + 8], "little")
            bits = int.from_bytes(data[body + 14 : body + 16], "little")
        elif chunk_id == b"data":
            if rate is None or channels != 1 or bits != 16:
                raise EspeakError(f"unsupported WAV format: {channels=} {bits=} {rate=}")
            payload = data[body:]
            payload = payload[: len(payload) - len(payload) % 2]
            samples = np.frombuffer(payload, dtype="<i2").astype(np.float32) / 32768.0
            return samples, rate
        pos = body + size + (size & 1)
    raise EspeakError("espeak-ng output has no data chunk")


def espeak_synthesize(text: str, voice: str, speed: int, pitch: int) -> tuple[np.ndarray, int]:
    """Synthesize ``text`` with espeak-ng and return ``(float32 samples, sample_rate)``.

    Args:
        text: the text to speak.
        voice: an espeak-ng voice spec such as ``"en-gb-scotland+f2"``.
        speed: speaking rate in words per minute (espeak ``-s``, useful range 80..450).
        pitch: base pitch (espeak ``-p``, 0..99).
    """
    cmd = [find_espeak(), "-v", voice, "-s", str(int(speed)), "-p", str(int(pitch))]
    cmd += ["--stdout", "--", text]
    proc = subprocess.run(cmd, capture_output=True, timeout=60)
    stderr = proc.stderr.decode("utf-8", errors="replace").strip()
    if proc.returncode != 0 or not proc.stdout:
        raise EspeakError(f"espeak-ng failed for voice {voice!r}: {stderr or proc.returncode}")
    samples, rate = decode_wav_pcm16(proc.stdout)
    if samples.size == 0 or not np.any(samples):
        raise EspeakError(f"espeak-ng produced silence for {text!r} with voice {voice!r}")
    return samples, rate
