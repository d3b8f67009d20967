"""Tests for the local Speech Commands v0.02 reader on a tiny fake folder tree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from training.data.labels import SC10_LABELS
from training.data.speech_commands import (
    SpeechCommandsConfig,
    SpeechCommandsDataset,
    list_split,
    load_clip,
    resolve_root,
)

WORDS = ("yes", "no", "stop", "bed")  # "bed" is not an SC10 word


def _fake_tree(base: Path) -> Path:
    """speech_commands_v0.02 with 3 files per word; file 0 -> valid, file 1 -> test."""
    root = base / "speech_commands_v0.02"
    valid, test = [], []
    rng = np.random.default_rng(0)
    for w, word in enumerate(WORDS):
        (root / word).mkdir(parents=True)
        for n in range(3):
            name = f"{w:02x}{n:06x}_nohash_{n}.wav"
            length = 16000 if n != 2 else 12000 + 4000 * w  # some short, some long clips
            audio = (0.1 * rng.standard_normal(length)).astype(np.float32)
            sf.write(root / word / name, audio, 16000, subtype="PCM_16")
            (valid if n == 0 else test if n == 1 else []).append(f"{word}/{name}")
    noise = root / "_background_noise_"
    noise.mkdir()
    sf.write(noise / "white.wav", np.zeros(32000, np.float32), 16000)
    (root / "validation_list.txt").write_text("\n".join(valid) + "\n")
    (root / "testing_list.txt").write_text("\n".join(test) + "\n")
    return root


def test_resolve_root(tmp_path: Path) -> None:
    root = _fake_tree(tmp_path)
    assert resolve_root(tmp_path) == root
    assert resolve_root(root) == root
    with pytest.raises(FileNotFoundError, match="speech_commands"):
        resolve_root(tmp_path / "missing")


def test_official_splits_and_label_filtering(tmp_path: Path) -> None:
    _fake_tree(tmp_path)
    splits = {s: list_split(tmp_path, s) for s in ("train", "valid", "test")}
    for split, items in splits.items():
        assert len(items) == 3  # yes, no, stop; "bed" filtered out
        assert sorted(label for _, label in items) == sorted(
            SC10_LABELS.index(w) for w in ("yes", "no", "stop")
        )
        suffix = {"valid": "_0.wav", "test": "_1.wav", "train": "_2.wav"}[split]
        assert all(p.name.endswith(suffix) for p, _ in items)
        assert all(p.parent.name != "bed" for p, _ in items)
    names = [{p for p, _ in items} for items in splits.values()]
    assert names[0].isdisjoint(names[1]) and names[0].isdisjoint(names[2])
    with pytest.raises(ValueError):
        list_split(tmp_path, "bogus")


def test_dataset_pads_and_crops(tmp_path: Path) -> None:
    _fake_tree(tmp_path)
    ds = SpeechCommandsDataset(SpeechCommandsConfig(root=str(tmp_path)), "train")
    assert len(ds) == 3
    for i in range(len(ds)):
        wave, label = ds[i]
        assert wave.shape == (16000,) and wave.dtype == torch.float32
        assert 0 <= label < len(SC10_LABELS)
        assert torch.isfinite(wave).all()
    # "yes" train clip is 12000 samples: zero-padded at the end
    yes = next(i for i, (_, label) in enumerate(ds.items) if label == 0)
    wave, _ = ds[yes]
    assert wave[:12000].abs().sum() > 0 and (wave[12000:] == 0).all()


def test_load_clip_resamples(tmp_path: Path) -> None:
    path = tmp_path / "x.wav"
    sf.write(path, np.full((8000, 2), 0.25, np.float32), 8000)  # stereo, 8 kHz, 1 s
    clip = load_clip(path)
    assert clip.shape == (16000,)
    assert abs(float(clip[4000:12000].mean()) - 0.25) < 1e-2
