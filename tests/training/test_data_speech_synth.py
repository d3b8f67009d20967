"""Tests for the espeak-ng based synthetic SC10 corpus."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from training.data.audio import AugmentConfig, augment_clip
from training.data.speech_synth import (
    SC10_LABELS,
    SPLITS,
    EspeakNotFoundError,
    SynthConfig,
    SynthSpeechDataset,
    all_voices,
    clip_specs,
    generate_clips,
    split_voices,
    synthesize_clip,
    synthesize_word,
    write_examples,
)

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="apt-get install espeak-ng"
)

# 6 voices -> 4 train, 1 valid, 1 test; 2 words x 1 rendition per voice.
TINY = SynthConfig(
    accents=("en-us", "en-gb-scotland"),
    variants=("m1", "f2", "klatt"),
    words=("yes", "stop"),
    renditions=1,
)


def test_labels() -> None:
    assert SC10_LABELS == ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")


def test_split_by_voice_is_disjoint_and_deterministic() -> None:
    cfg = SynthConfig()
    splits = split_voices(cfg)
    voices = all_voices(cfg)
    assert len(voices) == len(cfg.accents) * len(cfg.variants)
    sets = {name: set(v) for name, v in splits.items()}
    assert sets["train"].isdisjoint(sets["test"])
    assert sets["train"].isdisjoint(sets["valid"])
    assert sets["valid"].isdisjoint(sets["test"])
    assert set().union(*sets.values()) == set(voices)
    assert abs(len(sets["test"]) / len(voices) - 0.15) < 0.02
    assert split_voices(SynthConfig()) == splits
    assert split_voices(SynthConfig(seed=1))["test"] != splits["test"]
    train_voices = {s.voice for s in clip_specs(cfg, "train")}
    test_voices = {s.voice for s in clip_specs(cfg, "test")}
    assert train_voices.isdisjoint(test_voices)


def test_clip_specs_cover_words_and_ranges() -> None:
    cfg = SynthConfig()
    specs = clip_specs(cfg, "valid")
    assert len(specs) == len(split_voices(cfg)["valid"]) * 10 * cfg.renditions
    assert {s.word for s in specs} == set(SC10_LABELS)
    assert all(SC10_LABELS[s.label] == s.word for s in specs)
    assert all(120 <= s.speed <= 220 and 30 <= s.pitch <= 70 for s in specs)
    assert clip_specs(cfg, "valid") == specs


def test_augment_is_deterministic_and_bounded() -> None:
    clean = np.sin(np.linspace(0, 2000, 9000)).astype(np.float32)
    a = augment_clip(clean, AugmentConfig(), np.random.default_rng(1))
    b = augment_clip(clean, AugmentConfig(), np.random.default_rng(1))
    c = augment_clip(clean, AugmentConfig(), np.random.default_rng(2))
    assert a.shape == (16000,) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.abs(a).max() <= 1.0


def test_missing_espeak_gives_install_hint(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EspeakNotFoundError, match="apt-get install espeak-ng"):
        synthesize_word("yes")
    with pytest.raises(EspeakNotFoundError, match="apt-get install espeak-ng"):
        generate_clips(TINY, "train", tmp_path)


@needs_espeak
def test_synthesize_word() -> None:
    audio = synthesize_word("left", "en-gb-x-rp+f3", speed=150, pitch=40)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert 0.1 * 16000 < len(audio) < 16000
    assert abs(float(np.abs(audio).max()) - 0.9) < 1e-3
    np.testing.assert_array_equal(audio, synthesize_word("left", "en-gb-x-rp+f3", 150, 40))
    assert not np.array_equal(audio[:1000], synthesize_word("left", "en-us+m3", 150, 40)[:1000])
    clip = synthesize_clip("go", offset=100)
    assert clip.shape == (16000,) and (clip[:100] == 0).all() and clip[100:2000].any()


@needs_espeak
def test_generate_dataset_and_cache(tmp_path: Path) -> None:
    serial = generate_clips(TINY, "train", workers=1)
    assert len(serial) == 4 * 2
    pooled = generate_clips(TINY, "train", tmp_path, workers=2)  # process-pool path
    np.testing.assert_array_equal(serial.audio, pooled.audio)
    np.testing.assert_array_equal(serial.offsets, pooled.offsets)
    assert len(list(tmp_path.glob("sc10synth-train-*.npz"))) == 1
    cached = generate_clips(TINY, "train", tmp_path)
    np.testing.assert_array_equal(cached.audio, serial.audio)
    assert list(cached.voices) == list(serial.voices)

    test_voices = set(generate_clips(TINY, "test", workers=1).voices.tolist())
    assert test_voices.isdisjoint(serial.voices.tolist())

    ds = SynthSpeechDataset(serial, TINY)
    again = SynthSpeechDataset(generate_clips(TINY, "train", tmp_path), TINY)
    for i in range(len(ds)):
        wave, label = ds[i]
        assert wave.shape == (16000,) and wave.dtype == torch.float32
        assert torch.isfinite(wave).all() and float(wave.pow(2).sum()) > 1e-3
        assert label in (SC10_LABELS.index("yes"), SC10_LABELS.index("stop"))
        assert torch.equal(wave, again[i][0])
    first = ds[0][0]
    ds.set_epoch(1)
    assert not torch.equal(first, ds[0][0])
    clean = SynthSpeechDataset(serial, TINY, augment=False)[0][0]
    assert (clean == 0).sum() > 1000  # word placed in silence, no noise


@needs_espeak
def test_write_examples(tmp_path: Path) -> None:
    paths = write_examples(tmp_path, TINY, count=2, split=SPLITS[0])
    assert len(paths) == 2
    for path in paths:
        audio, rate = sf.read(path)
        assert rate == 16000 and audio.shape == (16000,)
