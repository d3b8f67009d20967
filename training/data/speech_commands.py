"""Google Speech Commands v0.02 read from a local folder, restricted to the SC10 words.

Expected layout (the extracted ``speech_commands_v0.02.tar.gz``)::

    <root>/<word>/<speaker>_nohash_<n>.wav
    <root>/validation_list.txt      # one "<word>/<file>.wav" per line
    <root>/testing_list.txt

``root`` may also be a parent folder holding ``speech_commands_v0.02/`` or torchaudio's
``SpeechCommands/speech_commands_v0.02/``. Splits are the official ones: files listed in
``validation_list.txt`` are "valid", in ``testing_list.txt`` "test", every other file "train".
WAVs are read with soundfile (torchaudio's loader needs torchcodec/ffmpeg), resampled to
16 kHz if needed, zero-padded at the end or cropped to 16000 samples. Nothing is downloaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from torch.utils.data import Dataset

from training.data.audio import resample
from training.data.labels import CLIP_SAMPLES, SAMPLE_RATE, SC10_LABELS

#: Official split names mapped to the list file that defines them (train = everything else).
SPLIT_LISTS: dict[str, str | None] = {
    "train": None,
    "valid": "validation_list.txt",
    "test": "testing_list.txt",
}

_CANDIDATE_SUBDIRS = ("", "speech_commands_v0.02", "SpeechCommands/speech_commands_v0.02")


@dataclass(frozen=True)
class SpeechCommandsConfig:
    """Where the local Speech Commands copy lives and how clips are shaped."""

    # Dataset folder, or a parent of ``speech_commands_v0.02`` (see module docstring).
    root: str = "data/speech_commands_v0.02"
    # Keywords kept (others, and ``_background_noise_``, are ignored); label = index here.
    labels: tuple[str, ...] = SC10_LABELS
    # Output length in samples (zero-padded at the end or cropped).
    clip_samples: int = CLIP_SAMPLES


def resolve_root(root: str | os.PathLike) -> Path:
    """Find the folder that contains ``testing_list.txt`` under or at ``root``."""
    base = Path(root).expanduser()
    for sub in _CANDIDATE_SUBDIRS:
        candidate = base / sub if sub else base
        if (candidate / "testing_list.txt").is_file():
            return candidate
    raise FileNotFoundError(
        f"no Speech Commands v0.02 folder (with testing_list.txt) at or under {base}; "
        "download and extract speech_commands_v0.02.tar.gz there (nothing is fetched here)"
    )


def _read_list(folder: Path, name: str) -> set[str]:
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"missing split list {path}")
    lines = path.read_text().splitlines()
    return {line.strip().replace("\\", "/") for line in lines if line.strip()}


def list_split(
    root: str | os.PathLike, split: str, labels: tuple[str, ...] = SC10_LABELS
) -> list[tuple[Path, int]]:
    """``(wav path, label index)`` pairs of ``split``, sorted by relative path."""
    if split not in SPLIT_LISTS:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLIT_LISTS)}")
    folder = resolve_root(root)
    valid = _read_list(folder, "validation_list.txt")
    test = _read_list(folder, "testing_list.txt")
    items = []
    for label, word in enumerate(labels):
        word_dir = folder / word
        if not word_dir.is_dir():
            continue
        for wav in sorted(word_dir.glob("*.wav")):
            rel = f"{word}/{wav.name}"
            if split == "valid":
                keep = rel in valid
            elif split == "test":
                keep = rel in test
            else:
                keep = rel not in valid and rel not in test
            if keep:
                items.append((wav, label))
    return items


def load_clip(path: str | os.PathLike, length: int = CLIP_SAMPLES) -> np.ndarray:
    """Read a WAV as mono float32 at 16 kHz, zero-padded at the end or cropped to ``length``."""
    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    mono = audio.mean(axis=1)
    if rate != SAMPLE_RATE:
        mono = resample(mono, rate, SAMPLE_RATE)
    out = np.zeros(length, dtype=np.float32)
    n = min(length, len(mono))
    out[:n] = mono[:n]
    return out


class SpeechCommandsDataset(Dataset):
    """SC10 subset of a local Speech Commands copy: items are ``(float32 [16000], label)``."""

    def __init__(self, config: SpeechCommandsConfig, split: str) -> None:
        self.config = config
        self.split = split
        self.items = list_split(config.root, split, config.labels)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        return torch.from_numpy(load_clip(path, self.config.clip_samples)), label
