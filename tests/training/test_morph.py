"""WORLD morphs: new pitch and vocal tract from a training voice, cached, sampled, never from a
held-out voice."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from training.data import morph
from training.data.corpus import CorpusConfig, VoiceClips, cache_key
from training.data.engines import TTSVoice
from training.data.labels import SAMPLE_RATE
from training.data.sc12 import UNK, KWSWindows, WindowConfig, WordPool
from training.data.vocab import SC12_LABELS

pytest.importorskip("pyworld", reason="pyworld is in the train extra")


def vowel(f0: float, seconds: float = 0.5) -> np.ndarray:
    """A sung 'ah': a glottal pulse train at `f0` through two formant resonators, int16."""
    from scipy.signal import lfilter

    n = int(seconds * SAMPLE_RATE)
    x = np.zeros(n)
    x[:: int(SAMPLE_RATE / f0)] = 1.0
    for fc, bw in ((700.0, 110.0), (1200.0, 120.0)):
        r = np.exp(-np.pi * bw / SAMPLE_RATE)
        x = lfilter([1.0], [1.0, -2 * r * np.cos(2 * np.pi * fc / SAMPLE_RATE), r * r], x)
    x *= np.hanning(n)
    return np.round(0.8 * x / np.abs(x).max() * 32767).astype(np.int16)


def median_f0(x: np.ndarray) -> float:
    import pyworld

    f0, _ = pyworld.dio(x.astype(np.float64) / 32767, SAMPLE_RATE)
    return float(np.median(f0[f0 > 0]))


def spectral_centroid(x: np.ndarray) -> float:
    mag = np.abs(np.fft.rfft(x.astype(np.float64)))
    freqs = np.fft.rfftfreq(len(x), 1 / SAMPLE_RATE)
    return float((mag * freqs).sum() / mag.sum())


def test_morphs_are_stable_and_alternate_up_and_down():
    ms = morph.morphs_for("flite:kal", 0, 4)
    assert ms == morph.morphs_for("flite:kal", 0, 4)
    assert ms != morph.morphs_for("flite:slt", 0, 4)
    for j, m in enumerate(ms):
        (f_lo, f_hi), (e_lo, e_hi) = morph.UP if j % 2 == 0 else morph.DOWN
        assert f_lo <= m.f0 <= f_hi and e_lo <= m.env <= e_hi
    assert len({m.tag for m in ms}) == 4


def test_envelope_warp_moves_frequencies_by_the_ratio():
    a = np.zeros((1, 101))
    a[0, 40] = 1.0
    assert np.array_equal(morph._warp(a, 1.0), a)
    assert int(np.argmax(morph._warp(a, 1.25)[0])) == 50
    assert int(np.argmax(morph._warp(a, 0.5)[0])) == 20


@pytest.mark.parametrize("m", [morph.Morph(1.6, 1.12), morph.Morph(0.7, 0.9)])
def test_morph_moves_pitch_and_formants(m):
    x = vowel(120.0)
    y = morph.morph_clip(x, m)
    assert y.dtype == np.int16 and abs(len(y) - len(x)) < 0.02 * len(x)
    assert median_f0(y) == pytest.approx(m.f0 * median_f0(x), rel=0.05)
    # the envelope moved with it: formants up for env > 1, down for env < 1
    assert (spectral_centroid(y) > spectral_centroid(x)) == (m.env > 1)
    assert 0.85 * 32767 < np.abs(y).max() <= 0.91 * 32767  # peak-normalised like clean clips
    short = np.arange(100, dtype=np.int16)
    assert np.array_equal(morph.morph_clip(short, m), short)


def _voice(name: str, speaker: str, engine: str = "flite") -> VoiceClips:
    clips = [vowel(f, 0.2 + 0.02 * i) for i, f in enumerate((110.0, 130.0, 150.0))]
    lengths = np.array([len(c) for c in clips])
    labels = np.array([0, 1, UNK])
    return VoiceClips(
        TTSVoice(engine, name, speaker),
        np.concatenate(clips),
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        labels,
        np.array([SC12_LABELS[i] for i in labels]),
    )


def test_morphed_voices_keep_words_and_speaker_and_are_cached(tmp_path):
    cfg = CorpusConfig(seed=0)
    src = [_voice("kal", "kal"), _voice("slt", "slt")]
    got = morph.morphed_voices(tmp_path, cfg, src, 2, workers=1, progress=False)
    assert len(got) == 4 and len(list(tmp_path.glob("morph-*.npz"))) == 4
    for vc, s in zip(got, [src[0]] * 2 + [src[1]] * 2, strict=True):
        assert vc.voice.morph and vc.voice.key == f"{s.voice.key}~{vc.voice.morph}"
        assert (vc.voice.engine, vc.voice.speaker) == (s.voice.engine, s.voice.speaker)
        assert np.array_equal(vc.labels, s.labels) and len(vc.offsets) == len(s.offsets)
        assert cache_key(cfg, vc.voice) not in (cache_key(cfg, s.voice), "")
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("morph-*.npz")}
    again = morph.morphed_voices(tmp_path, cfg, src, 2, workers=1, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("morph-*.npz")} == stamps
    for a, b in zip(got, again, strict=True):
        assert a.voice == b.voice and np.array_equal(a.audio, b.audio)
    with pytest.raises(ValueError, match="clean voices"):
        morph.morphed_voices(tmp_path, cfg, got[:1], 1, workers=1, progress=False)


def test_windows_draw_morphed_words_with_p_morph():
    src = [_voice("kal", "kal"), _voice("m1", "espeak-m1", engine="espeak")]
    pool = WordPool.from_voices([*src, morph.morph_voice_of(src[0], morph.Morph(1.5, 1.1))])
    assert pool.morphed.sum() == 3 and not pool.morphed[:6].any()

    def share(p: float) -> float:
        ds = KWSWindows(pool, [], WindowConfig(p_morph=p), length=1)
        rng = np.random.default_rng(0)
        picks = [ds._pick(int(rng.integers(2)), rng) for _ in range(2000)]
        return float(pool.morphed[picks].mean())

    assert share(0.0) == 0.0 and share(1.0) == 1.0
    assert 0.2 < share(0.25) < 0.3


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("espeak-ng") is None or shutil.which("flite") is None,
    reason="needs espeak-ng and flite",
)
def test_only_training_voices_are_morphed(tmp_path):
    from training.recipes.kws import KWSOptions, load_split

    opts = KWSOptions(cache_dir=str(tmp_path), tiny_corpus=True, morphs=1, workers=1)
    pools = load_split(opts, seed=0)
    train = pools["train"]
    assert train.morphed.any()
    morphed_speakers = set(train.speakers[train.morphed])
    assert morphed_speakers <= set(train.speakers[~train.morphed])
    assert "espeak" not in set(train.engines[train.morphed])
    for name in ("valid", "test"):
        assert not pools[name].morphed.any()
        assert not morphed_speakers & set(pools[name].speakers)


def test_negative_morph_count_is_refused():
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe

    with pytest.raises(ValueError, match="--morphs must be >= 0"):
        KWSRecipe(KWSOptions(morphs=-1), ModelOptions(), TrainConfig())
