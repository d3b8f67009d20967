"""The SC12 corpus: vocabulary, speaker-disjoint splits, deterministic rendering and windows."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from training.data import codecs
from training.data.corpus import (
    CorpusConfig,
    all_tts_voices,
    engines_for,
    generate,
    render_items,
    voice_items,
)
from training.data.engines import (
    EVAL_ONLY_SPEAKERS,
    FESTIVAL_ACCENTED,
    FESTIVAL_VOICES,
    FLITE_VOICES,
    MBROLA_ACCENTED,
    MBROLA_FALLBACK,
    MBROLA_VOICES,
    MORE_ENGINES,
    PICO_ACCENTED,
    PICO_VOICES,
    RESPELL,
    RHVOICE_ACCENTED,
    RHVOICE_ACCENTED_FREE,
    RHVOICE_ACCENTED_TEST_ONLY,
    RHVOICE_VOICES,
    UNSAYABLE,
    EngineNotFoundError,
    TTSVoice,
    engine_text,
    mbrola_voice_installed,
    mbrola_word,
    mbrola_word_or_fallback,
    rhvoice_synthesize,
    rhvoice_voice_installed,
)
from training.data.espeak import EspeakError
from training.data.labels import SC10_LABELS
from training.data.rooms import RoomConfig
from training.data.sc12 import IGNORE, SIL, UNK, KWSWindows, WindowConfig, WordPool, clip_windows
from training.data.splits import PRESETS, check_disjoint, split_voices
from training.data.vocab import (
    HOMOPHONES,
    NEAR_MISSES,
    SC12_LABELS,
    check_vocabulary,
    unknown_words,
)

needs = {
    e: pytest.mark.skipif(shutil.which(x) is None, reason=f"{x} not installed")
    for e, x in (
        ("espeak", "espeak-ng"),
        ("flite", "flite"),
        ("festival", "festival"),
        ("mbrola", "mbrola"),
        ("rhvoice", "RHVoice-test"),
        ("pico", "pico2wave"),
    )
}
needs["rhvoice-uk"], needs["rhvoice-eo"] = (  # voices of RHVoice's Ukrainian, Esperanto packages
    pytest.mark.skipif(not rhvoice_voice_installed(v), reason=f"RHVoice {v} not installed")
    for v in ("anatol", "spomenka")
)
needs["mbrola-es3"], needs["mbrola-it1"] = (
    pytest.mark.skipif(not mbrola_voice_installed(v), reason=f"{v} not installed")
    for v in ("mb-es3", "mb-it1")
)
#: The corpus with the opt-in engines (MBROLA, RHVoice, Pico): every preset has test voices.
MORE = CorpusConfig(engines=engines_for(True))
#: ... and with RHVoice's voices of other languages.
MORE_RH = CorpusConfig(engines=engines_for(True), rhvoice_accents=True)
#: ... and with Pico's voices of other languages.
MORE_PICO = CorpusConfig(engines=engines_for(True), pico_accents=True)
#: ... and with MBROLA's speakers of other languages.
MORE_MB = CorpusConfig(engines=engines_for(True), mbrola_accents=True)


def test_label_set_and_unknown_words():
    assert (*SC10_LABELS, "_silence_", "_unknown_") == SC12_LABELS
    words = unknown_words()
    assert len(words) >= 300 and len(set(words)) == len(words)
    for near in ("now", "goat", "top", "dawn", "yet", "of", "bright", "lift", "nine"):
        assert near in NEAR_MISSES and near in words
    assert not set(words) & (set(SC10_LABELS) | HOMOPHONES)
    with pytest.raises(ValueError, match="homophones"):
        check_vocabulary(("cat", "know"))


@pytest.mark.parametrize("preset", PRESETS)
def test_splits_are_speaker_disjoint(preset):
    voices = all_tts_voices(MORE)
    split = split_voices(voices, preset)
    check_disjoint(split)
    speakers = {k: {v.speaker for v in vs} for k, vs in split.items()}
    assert not speakers["train"] & (speakers["valid"] | speakers["test"])
    assert not speakers["valid"] & speakers["test"]
    assert split["train"] and split["test"]
    if preset.startswith("loso-"):
        held = preset.removeprefix("loso-")
        assert {v.engine for v in split["test"]} == {held}
        assert all(v.engine != held for v in split["train"] + split["valid"])
        assert len(split["test"]) == sum(v.engine == held for v in voices)


def test_shared_speakers_stay_together():
    voices = all_tts_voices(CorpusConfig())
    by_speaker = {}
    for v in voices:
        by_speaker.setdefault(v.speaker, set()).add(v.engine)
    assert by_speaker["kal"] == {"flite", "festival"} and by_speaker["slt"] == {"flite", "festival"}
    flite_out = split_voices(voices, "loso-flite")
    assert not {v.speaker for v in flite_out["train"]} & {"kal", "slt", "awb", "rms"}
    final = split_voices(voices, "final")
    test_voices = {v.key for v in final["test"]}
    assert {"flite:awb", "festival:ked_diphone"} <= test_voices
    assert {v.engine for v in final["test"]} == {"espeak", "flite", "festival", "kokoro", "piper"}
    # every accent of a held-out espeak variant is held out with it
    for v in final["test"]:
        if v.engine == "espeak":
            variant = v.name.split("+")[1]
            assert all(w.key in test_voices for w in voices if w.name.endswith("+" + variant))


def test_more_engines_are_opt_in_and_their_shared_speakers_stay_together():
    default = all_tts_voices(CorpusConfig())
    assert not {v.engine for v in default} & set(MORE_ENGINES)
    voices = all_tts_voices(MORE)
    assert set(default) < set(voices)
    by_engine = {e: [v for v in voices if v.engine == e] for e in MORE_ENGINES}
    assert [len(by_engine[e]) for e in MORE_ENGINES] == [20, 6, 2]
    speakers = {v.key: v.speaker for v in voices}
    assert speakers["rhvoice:alan"] == speakers["flite:awb"] == "awb"
    assert speakers["rhvoice:slt"] == speakers["flite:slt"] == "slt"
    assert len({v.speaker for v in by_engine["mbrola"]}) == 20
    final = split_voices(voices, "final")
    where = {v.key: name for name, vs in final.items() for v in vs}
    assert where["rhvoice:alan"] == "test" and where["rhvoice:slt"] == "train"
    assert where["mbrola:mb-us1"] == where["mbrola:mb-hu1-en"] == where["pico:en-GB"] == "test"
    assert where["mbrola:mb-us3"] == where["rhvoice:bdl"] == "valid"
    assert {v.engine for v in final["test"]} == {"espeak", "flite", "festival", "kokoro", "piper",
                                                 *MORE_ENGINES}  # fmt: skip
    # every engine keeps training voices in the final split
    assert {v.engine for v in final["train"]} >= set(MORE_ENGINES)
    # leaving RHVoice out leaves out awb and slt through flite and festival too
    rh_out = split_voices(voices, "loso-rhvoice")
    assert not {v.speaker for v in rh_out["train"] + rh_out["valid"]} & {"awb", "slt", "clb"}
    assert "flite:kal" in {v.key for v in rh_out["train"]}
    # ... and leaving flite out leaves out RHVoice's alan and slt
    fl_out = split_voices(voices, "loso-flite")
    assert {"rhvoice:alan", "rhvoice:slt"}.isdisjoint(v.key for v in fl_out["train"])
    assert "rhvoice:clb" in {v.key for v in fl_out["train"] + fl_out["valid"] + fl_out["test"]}


@pytest.mark.parametrize("preset", PRESETS)
def test_licence_restricted_voices_are_never_trained_on(preset):
    voices = all_tts_voices(MORE)
    restricted = {v.key for v in voices if v.speaker in EVAL_ONLY_SPEAKERS}
    assert restricted == {"rhvoice:evgeniy-eng", "rhvoice:lyubov"}
    split = split_voices(voices, preset)
    assert restricted.isdisjoint(v.key for v in split["train"] + split["valid"])
    if preset in ("final", "loso-rhvoice"):
        assert restricted <= {v.key for v in split["test"]}
    else:
        assert restricted.isdisjoint(v.key for v in split["test"])


@pytest.mark.parametrize("preset", PRESETS)
def test_accented_rhvoice_voices_train_only_under_a_free_licence(preset):
    voices = all_tts_voices(MORE_RH)
    accented = [v for v in voices if v in RHVOICE_ACCENTED]
    assert len(accented) == 26 and set(all_tts_voices(MORE)) < set(voices)  # opt in
    assert len({v.speaker for v in accented}) == 26  # each a person of its own ...
    assert {v.speaker for v in accented} & EVAL_ONLY_SPEAKERS == {
        v.speaker for v in RHVOICE_ACCENTED_TEST_ONLY
    }  # ... ten of them trainable
    assert TTSVoice("rhvoice", "evgeniy-rus", "rh-evgeniy", "ru") in accented  # evgeniy-eng's
    split = split_voices(voices, preset)
    check_disjoint(split)
    restricted = {v.key for v in voices if v.speaker in EVAL_ONLY_SPEAKERS}
    assert restricted.isdisjoint(v.key for v in split["train"] + split["valid"])
    trained = {v.key for v in split["train"]}
    if preset == "final":
        assert {v.key for v in RHVOICE_ACCENTED_FREE} <= trained
        assert restricted <= {v.key for v in split["test"]}
        # the usual valid voices, and the usual test voices plus the restricted ones
        usual = split_voices(all_tts_voices(MORE), "final")
        assert split["valid"] == usual["valid"]
        assert {v.key for v in split["test"]} == {v.key for v in usual["test"]} | restricted
    if preset == "loso-rhvoice":
        assert not trained & {v.key for v in accented}


def test_rhvoice_accents_need_the_engine_and_a_missing_voice_is_an_error():
    with pytest.raises(ValueError, match="more-engines"):
        CorpusConfig(rhvoice_accents=True)  # RHVoice is not among the default engines
    if shutil.which("RHVoice-test") is not None:  # (it would speak with another voice)
        with pytest.raises(EngineNotFoundError, match="not installed"):
            rhvoice_synthesize("yes", "no-such-voice", 1.0, 1.0)


def test_a_word_a_voice_cannot_say_is_left_out_and_the_rest_stay(monkeypatch):
    voice = next(v for v in MBROLA_ACCENTED if v.key in UNSAYABLE)
    (gap,) = UNSAYABLE[voice.key]
    items = voice_items(MORE_MB, voice)
    assert gap not in {i.word for i in items}
    monkeypatch.setattr("training.data.corpus.UNSAYABLE", {})
    everything = voice_items(MORE_MB, voice)
    assert [i for i in everything if i.word != gap] == items and len(everything) == len(items) + 1


@needs["mbrola-it1"]
def test_an_mbrola_word_silent_at_its_drawn_settings_falls_back_in_a_fixed_order():
    voice = next(v for v in MBROLA_ACCENTED if v.name == "mb-it1")
    text = engine_text(voice, "cup")
    with pytest.raises(EspeakError, match="silence"):  # a reduced vowel it1 lacks, at 186 wpm
        mbrola_word(text, voice.name, 186, 48)
    a, rate = mbrola_word_or_fallback(text, voice.name, 186, 48)
    b, _ = mbrola_word(text, voice.name, MBROLA_FALLBACK[0][0], 48)  # the first fallback
    assert np.array_equal(a, b) and np.any(a) and rate == 16000
    ok, _ = mbrola_word_or_fallback(text, voice.name, 160, 50)  # fine as drawn: unchanged
    assert np.array_equal(ok, mbrola_word(text, voice.name, 160, 50)[0])


def test_pico_and_mbrola_accents_need_their_engine():
    with pytest.raises(ValueError, match="more-engines"):
        CorpusConfig(pico_accents=True)  # Pico is not among the default engines
    with pytest.raises(ValueError, match="more-engines"):
        CorpusConfig(mbrola_accents=True)
    if shutil.which("mbrola") is not None:  # a missing database is named, with its package
        with pytest.raises(EngineNotFoundError, match="mbrola-zz9"):
            mbrola_word("yes", "mb-zz9-en", 160, 50)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize(
    ("cfg", "extra", "engine"),
    [(MORE_PICO, PICO_ACCENTED, "pico"), (MORE_MB, MBROLA_ACCENTED, "mbrola")],
    ids=["pico", "mbrola"],
)
def test_more_accented_speakers_train_and_test_only_in_their_fold(preset, cfg, extra, engine):
    voices = all_tts_voices(cfg)
    accented = [v for v in voices if v in extra]
    assert accented == sorted(extra) and set(all_tts_voices(MORE)) < set(voices)  # opt in
    speakers = {v.speaker for v in accented}
    assert len(speakers) == len(extra)  # each a person of her or his own, new to the corpus
    assert not speakers & {v.speaker for v in all_tts_voices(MORE)}
    assert not speakers & EVAL_ONLY_SPEAKERS and all(v.lang != "en" for v in accented)
    split = split_voices(voices, preset)
    check_disjoint(split)
    keys = {v.key for v in accented}
    usual = split_voices(all_tts_voices(MORE), preset)
    for part in ("train", "valid", "test"):  # every voice there before keeps its place
        assert [v for v in split[part] if v.key not in keys] == usual[part], part
    where = "test" if preset == f"loso-{engine}" else "train"
    assert keys <= {v.key for v in split[where]}


def test_accented_pico_and_mbrola_voices_read_respelled_commands_and_words_as_written():
    for voice in PICO_ACCENTED + MBROLA_ACCENTED:
        assert sorted(RESPELL[voice.lang]) == sorted(SC10_LABELS), voice.lang
        assert engine_text(voice, "garden") == "garden"  # other words: an accent of their own
        assert engine_text(voice, "right") == RESPELL[voice.lang]["right"] != "right"
    english = PICO_VOICES[0]
    assert engine_text(english, "right") == "right"  # the English voices read the word


def test_accented_rhvoice_voices_read_respelled_commands_in_their_own_script():
    for voice in RHVOICE_ACCENTED:
        table = RESPELL[voice.lang]
        assert sorted(table) == sorted(SC10_LABELS), voice.lang
        for word in ("yes", "right", "bright", "garden"):
            text = engine_text(voice, word)
            cyrillic = any("\u0400" <= ch <= "\u04ff" for ch in text)
            assert cyrillic == (voice.lang in ("ru", "uk", "ky", "tt", "mk")), (voice, text)
            if cyrillic:  # no Latin letter is left for the voice to spell out
                assert not any("a" <= ch <= "z" for ch in text), (voice, text)
    uk, mk, eo = (
        next(v for v in RHVOICE_ACCENTED if v.lang == lang) for lang in ("uk", "mk", "eo")
    )
    assert engine_text(uk, "go") == "ґоу" and engine_text(uk, "big") == "біґ"
    assert engine_text(mk, "right") == "рајт" and engine_text(mk, "yard") == "јард"
    assert engine_text(eo, "down") == "daŭn" and engine_text(eo, "garden") == "garden"


def test_more_engines_sample_unknown_words_and_draw_rates_from_the_seed():
    cfg = MORE
    for voice in (MBROLA_VOICES[0], RHVOICE_VOICES[2], PICO_VOICES[1]):
        items = voice_items(cfg, voice)
        assert items == voice_items(CorpusConfig(engines=engines_for(True)), voice)
        commands = [i for i in items if i.word in SC10_LABELS]
        assert len(commands) == 10 * cfg.command_renditions
        assert len(items) - len(commands) == cfg.neural_unknown_per_voice
        assert len({i.rate for i in commands}) > 1  # renditions differ in rate
        if voice.engine == "mbrola":  # espeak-ng's words per minute and pitch
            assert all(cfg.espeak_wpm[0] <= i.rate <= cfg.espeak_wpm[1] for i in items)
        else:  # duration stretch and pitch scale
            assert all(cfg.stretch[0] <= i.rate <= cfg.stretch[1] for i in items)
            assert all(cfg.f0_scale[0] <= i.pitch <= cfg.f0_scale[1] for i in items)


def test_accented_voices_are_speakers_of_their_own_in_every_split():
    voices = all_tts_voices(CorpusConfig())
    accented = [v for v in voices if v.lang != "en"]
    assert (
        sorted(accented) == sorted(FESTIVAL_ACCENTED) and len({v.speaker for v in accented}) == 10
    )
    final = split_voices(voices, "final")
    where = {v.key: name for name, vs in final.items() for v in vs}
    assert where["festival:lp_diphone"] == "test" and where["festival:czech_ph"] == "valid"
    assert sum(where[v.key] == "train" for v in accented) == 8
    # leaving festival out leaves out its accented voices too
    assert all(v.lang == "en" for vs in split_voices(voices, "loso-festival").values()
               for v in vs if v.engine != "festival")  # fmt: skip


def test_accented_voices_read_commands_respelled_and_other_words_as_written():
    it, ru = FESTIVAL_ACCENTED[7], FESTIVAL_ACCENTED[9]
    assert (it.lang, ru.lang) == ("it", "ru")
    for lang, table in RESPELL.items():
        assert sorted(table) == sorted(SC10_LABELS), lang
    assert engine_text(it, "right") == "rait" and engine_text(it, "garden") == "garden"
    assert engine_text(ru, "stop") == "стоп" and engine_text(ru, "cat") == "кат"
    assert engine_text(FESTIVAL_VOICES[1], "right") == "right"  # English voices read the word
    # what a voice reads is part of its cache key: changing a respelling re-renders it
    from training.data import corpus

    key = corpus.cache_key(CorpusConfig(), it) if shutil.which("festival") else None
    if key is not None:
        old = RESPELL["it"]["right"]
        RESPELL["it"]["right"] = "rajt"
        try:
            assert corpus.cache_key(CorpusConfig(), it) != key
        finally:
            RESPELL["it"]["right"] = old


def test_voice_items_are_deterministic_from_the_seed():
    cfg = CorpusConfig()
    v = TTSVoice("espeak", "en-us+f2", "espeak-f2")
    assert voice_items(cfg, v) == voice_items(CorpusConfig(), v)
    assert voice_items(cfg, v) != voice_items(CorpusConfig(seed=1), v)
    slt = voice_items(cfg, FLITE_VOICES[4])
    assert {i.word for i in slt} == set(SC10_LABELS) | set(cfg.unknown)
    hts = voice_items(cfg, FESTIVAL_VOICES[2])
    assert all(i.rate == 1.0 for i in hts)  # HTS ignores Duration_Stretch: one rendition


@pytest.mark.parametrize(
    "voice",
    [
        pytest.param(TTSVoice("espeak", "en-gb+m3", "espeak-m3"), marks=needs["espeak"]),
        pytest.param(FLITE_VOICES[2], marks=needs["flite"]),
        pytest.param(FESTIVAL_VOICES[1], marks=needs["festival"]),
        pytest.param(FESTIVAL_ACCENTED[9], marks=needs["festival"]),  # Russian, Cyrillic text
        pytest.param(MBROLA_VOICES[0], marks=needs["mbrola"]),
        pytest.param(MBROLA_VOICES[9], marks=needs["mbrola"]),  # a German woman reading English
        pytest.param(RHVOICE_VOICES[2], marks=needs["rhvoice"]),
        pytest.param(
            RHVOICE_ACCENTED_FREE[4], marks=needs["rhvoice-uk"]
        ),  # Ukrainian, Cyrillic text
        pytest.param(RHVOICE_ACCENTED_FREE[9], marks=needs["rhvoice-eo"]),  # Esperanto
        pytest.param(PICO_VOICES[0], marks=needs["pico"]),
        pytest.param(PICO_ACCENTED[2], marks=needs["pico"]),  # French, respelled
        pytest.param(MBROLA_ACCENTED[2], marks=needs["mbrola-es3"]),  # Spanish, respelled
    ],
)
def test_rendering_is_deterministic(voice):
    items = voice_items(CorpusConfig(), voice)[:3] + voice_items(CorpusConfig(), voice)[-2:]
    a, b = render_items(voice, items), render_items(voice, items)
    assert len(a) == len(items)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == np.int16 and len(x) > 1600 and np.array_equal(x, y)


@needs["espeak"]
def test_generate_caches_per_voice_and_workers_do_not_matter(tmp_path):
    cfg = CorpusConfig(
        accents=("en-us",), variants=("m1", "f1"), engines=("espeak",), espeak_command_renditions=1,
        espeak_unknown_per_voice=2, unknown=unknown_words()[:10],
    )  # fmt: skip
    one = generate(cfg, tmp_path / "a", workers=1, progress=False)
    two = generate(cfg, tmp_path / "b", workers=2, progress=False)
    assert sorted(one) == sorted(two) == ["espeak:en-us+f1", "espeak:en-us+m1"]
    for k in one:
        assert np.array_equal(one[k].audio, two[k].audio)
        assert np.array_equal(one[k].labels, two[k].labels)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    again = generate(cfg, tmp_path / "a", workers=1, progress=False)  # from the cache
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == files
    assert np.array_equal(again["espeak:en-us+m1"].audio, one["espeak:en-us+m1"].audio)


def _pool() -> WordPool:
    """A synthetic pool (tones as words), no synthesizer needed."""
    return WordPool.from_voices(_voices())


def _voices() -> list:
    from training.data.corpus import VoiceClips

    rng = np.random.default_rng(0)
    voices = []
    for k, (engine, speaker) in enumerate((("espeak", "espeak-m1"), ("flite", "awb"))):
        clips, labels = [], []
        for lab in list(range(10)) + [UNK] * 6:
            n = int(rng.integers(4000, 9000))
            t = np.arange(n) / 16000
            clips.append(
                (0.5 * np.sin(2 * np.pi * (200 + 40 * lab + k) * t) * 32767).astype(np.int16)
            )
            labels.append(lab)
        lengths = np.array([len(c) for c in clips])
        vc = VoiceClips(
            TTSVoice(engine, f"v{k}", speaker),
            np.concatenate(clips),
            np.concatenate([[0], np.cumsum(lengths)]),
            np.array(labels),
            np.array([SC12_LABELS[i] for i in labels]),
        )
        voices.append(vc)
    return voices


def test_windows_are_deterministic_and_targets_follow_words():
    pool = _pool()
    ds = KWSWindows(pool, [], WindowConfig(), seed=3, length=64)
    x1, y1, w1, d1, *_ = ds[5]
    x2, y2, w2, d2, *_ = ds[5]
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and w1 == w2 and torch.equal(d1, d2)
    ds.set_epoch(1)
    assert not torch.equal(ds[5][0], x1)  # a new epoch draws new augmentation
    assert x1.shape == (38400,) and y1.shape == (120,)
    assert float(x1.abs().max()) <= 1.0
    seen = set()
    for i in range(64):
        y = ds[i].targets
        vals = y.tolist()
        seen |= set(vals)
        # a label run is always preceded by ignored frames (the word itself) or the window start
        for t in range(1, len(vals)):
            if vals[t] not in (SIL, IGNORE) and vals[t - 1] != vals[t]:
                assert vals[t - 1] == IGNORE
    assert SIL in seen and IGNORE in seen and UNK in seen
    assert seen & set(range(10))


def test_windows_name_each_unknown_words_class_where_the_targets_say_unknown():
    pool = _pool()
    unk = np.flatnonzero(pool.labels == UNK)
    vocab = ("cat", "dog", "dawn")
    pool.words = pool.words.astype(object)
    pool.words[unk] = [vocab[k % 3] for k in range(len(unk))]
    plain = KWSWindows(pool, [], WindowConfig(), seed=3, length=64)
    ds = KWSWindows(pool, [], WindowConfig(), seed=3, length=64, unknown_vocab=vocab)
    seen = set()
    for i in range(64):
        item, same = ds[i], plain[i]
        assert torch.equal(item.audio, same.audio) and torch.equal(item.targets, same.targets)
        assert torch.equal(same.classes, same.targets)  # no vocabulary: the targets themselves
        is_unk = item.targets == UNK
        assert torch.equal(item.classes[~is_unk], item.targets[~is_unk])
        assert bool((item.classes[is_unk] >= UNK).all())
        assert bool((item.classes[is_unk] < UNK + len(vocab)).all())
        seen |= set(item.classes[is_unk].tolist())
    assert seen == {UNK, UNK + 1, UNK + 2}
    with pytest.raises(ValueError, match="not in the unknown vocabulary: cat"):
        KWSWindows(pool, [], WindowConfig(), seed=3, length=4, unknown_vocab=("dog", "dawn"))


def test_clip_windows_place_the_word_near_the_end():
    pool = _pool()
    audio = clip_windows(pool, [0, 3, 12], [], seed=0, augment=False)
    assert audio.shape == (3, 24000)
    for row in audio:
        active = np.flatnonzero(np.abs(row.numpy()) > 0.05)
        tail = (24000 - active[-1]) / 16000
        assert 0.14 <= tail <= 0.46
    assert torch.equal(audio, clip_windows(pool, [0, 3, 12], [], seed=0, augment=False))


needs_ffmpeg = pytest.mark.skipif(not codecs.available(), reason="ffmpeg not installed")


@needs_ffmpeg
@pytest.mark.parametrize("codec", [codecs.Codec("mp3", 32), codecs.Codec("opus", 12)])
def test_codec_round_trip_keeps_every_clip_in_place(codec):
    from scipy import signal

    vc = _voices()[0]
    clips = [vc.audio[vc.offsets[i] : vc.offsets[i + 1]] for i in range(6)]
    chirp = signal.chirp(np.arange(8000) / 16000, 100, 0.5, 7000) * 0.5 * 32767
    clips.append(chirp.astype(np.int16))  # energy up to 7 kHz: what low bitrates cut
    out = codecs.roundtrip_clips(clips, codec)
    assert [len(c) for c in out] == [len(c) for c in clips]
    for a, b in zip(clips, out, strict=True):
        a, b = a.astype(np.float64), b.astype(np.float64)
        assert b.any() and not np.array_equal(a, b)  # lossy, not lost
        xc = signal.correlate(b, a, mode="full")
        lag = int(np.argmax(xc)) - (len(a) - 1)
        assert abs(lag) <= 16  # in place to within 1 ms
        assert np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b)) > 0.8
    spec = lambda x: np.abs(np.fft.rfft(x.astype(np.float64)))  # noqa: E731
    hi = slice(len(spec(clips[-1])) * 6 // 8, None)  # 6-8 kHz
    assert spec(out[-1])[hi].sum() < spec(clips[-1])[hi].sum()


@pytest.mark.slow  # 6 s: renders a voice ahead in a subprocess
@needs_ffmpeg
def test_rendering_ahead_fills_the_cache_that_runs_read(tmp_path):
    cfg, voices = CorpusConfig(), _voices()
    assert codecs.render_all(tmp_path, cfg, voices, workers=2) == [v.voice.key for v in voices]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == len(voices)
    other = tmp_path / "one-by-one"
    other.mkdir()
    for vc in voices:  # what a run makes for itself: the same audio, under the same name
        ahead = codecs.coded_voice(tmp_path, cfg, vc)
        alone = codecs.coded_voice(other, cfg, vc)
        assert np.array_equal(ahead.audio, alone.audio)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == files  # read, not redone
    assert sorted(p.name for p in other.iterdir()) == files


@needs_ffmpeg
def test_coded_voices_are_cached_and_each_voice_keeps_its_codec(tmp_path):
    cfg = CorpusConfig()
    vc = _voices()[1]
    a = codecs.coded_voice(tmp_path, cfg, vc)
    files = sorted(p.name for p in tmp_path.iterdir())
    tag = codecs.codec_for(vc.voice.key, cfg.seed).tag
    assert len(files) == 1 and files[0].startswith(f"codec-{tag}-")
    b = codecs.coded_voice(tmp_path, cfg, vc)  # from the cache
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    assert np.array_equal(a.audio, b.audio) and np.array_equal(a.offsets, vc.offsets)
    assert len(a.audio) == len(vc.audio) and not np.array_equal(a.audio, vc.audio)
    assert codecs.codec_for("espeak:en-us+m1", 0) == codecs.codec_for("espeak:en-us+m1", 0)
    assert len({codecs.codec_for(f"voice{i}", 0).tag for i in range(50)}) >= 5  # a spread


class AudioSpy(WordPool):
    """A pool that records each clip it is asked for: (index, coded) in `calls`."""

    calls: list[tuple[int, bool]]

    def audio(self, i: int, coded: bool = False) -> np.ndarray:
        self.calls.append((int(i), coded))
        return super().audio(i, coded)

    @classmethod
    def of(cls, pool: WordPool) -> AudioSpy:
        spy = cls(**pool.__dict__)
        spy.calls = []
        return spy


def test_windows_take_words_from_the_coded_copy_with_codec_prob():
    voices = _voices()

    def coded_share(prob: float, with_copy: bool = True) -> float:
        pool = AudioSpy.of(WordPool.from_voices(voices, voices if with_copy else None))
        ds = KWSWindows(pool, [], WindowConfig(room=RoomConfig(codec_prob=prob)), length=200)
        for i in range(200):
            ds[i]
        words = len(pool.calls) - 12 * 200  # (each window also mixes 12 clean babble words)
        return sum(coded for _, coded in pool.calls) / words

    assert coded_share(1.0) == 1.0 and coded_share(0.0) == 0.0
    assert 0.15 < coded_share(0.25) < 0.35
    assert coded_share(1.0, with_copy=False) == 0.0
    with pytest.raises(ValueError, match="match"):
        WordPool.from_voices(voices, voices[::-1])


def test_balance_engines_draws_each_engine_equally_and_default_draws_by_clips():
    from training.data.corpus import VoiceClips

    base = _voices()[1]  # a flite voice: three festival voices and one flite voice below
    voices = [base] + [
        VoiceClips(
            TTSVoice("festival", f"f{k}", f"fest{k}"),
            base.audio,
            base.offsets,
            base.labels,
            base.words,
        )
        for k in range(3)
    ]
    pool = WordPool.from_voices(voices)

    def flite_share(balance: bool) -> float:
        ds = KWSWindows(pool, [], WindowConfig(balance_engines=balance), length=1)
        rng = np.random.default_rng(0)
        labels = [*range(10), UNK]
        picks = [ds._pick(labels[rng.integers(11)], rng) for _ in range(4000)]
        return float((pool.engines[picks] == "flite").mean())

    assert 0.2 < flite_share(False) < 0.3  # one voice of four
    assert 0.45 < flite_share(True) < 0.55  # one engine of two
    a = KWSWindows(pool, [], WindowConfig(balance_engines=True), seed=2, length=4)
    b = KWSWindows(pool, [], WindowConfig(balance_engines=True), seed=2, length=4)
    assert all(torch.equal(a[i][0], b[i][0]) for i in range(4))


@pytest.mark.parametrize("balance", [False, True])
def test_p_near_miss_draws_that_share_of_unknown_words_among_the_near_misses(balance):

    words = ["now", "cat", "house", "dawn", "bird", "tree"]  # two near misses of six
    voices = []
    for vc in _voices():
        w = vc.words.copy()
        w[vc.labels == UNK] = words
        voices.append(replace(vc, words=w))
    pool = WordPool.from_voices(voices)

    def near_share(p: float) -> float:
        cfg = WindowConfig(p_near_miss=p, balance_engines=balance)
        ds = KWSWindows(pool, [], cfg, length=1)
        rng = np.random.default_rng(0)
        picks = [ds._pick(UNK, rng) for _ in range(3000)]
        assert (pool.labels[picks] == UNK).all()
        return float(np.isin(pool.words[picks], ["now", "dawn"]).mean())

    assert 0.28 < near_share(0.0) < 0.39  # as their share of the words
    assert 0.61 < near_share(0.5) < 0.72  # 0.5 + 0.5 / 3
    assert near_share(1.0) == 1.0
    # commands are drawn as before: the share only moves unknown words
    ds = KWSWindows(pool, [], WindowConfig(p_near_miss=1.0), length=1)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    plain = KWSWindows(pool, [], WindowConfig(), length=1)
    assert [ds._pick(c, rng_a) for c in range(10)] == [plain._pick(c, rng_b) for c in range(10)]


@pytest.mark.parametrize(
    "field",
    [
        "p_espeak",
        "p_morph",
        "p_near_miss",
        "p_command",
        "p_pair",
        "speed_prob",
        "reverb_prob",
        "clip_prob",
    ],
)
def test_word_mix_shares_outside_zero_one_are_refused(field):
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe

    flag = "--" + field.replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} must be in"):
        KWSRecipe(KWSOptions(**{field: 1.5}), ModelOptions(), TrainConfig())


def test_p_command_moves_words_between_commands_and_unknown_words_only():
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe, window_config

    assert window_config(KWSOptions()) == WindowConfig()  # the default draws as before
    pool = WordPool.from_voices(_voices())

    def shares(p_command: float) -> tuple[float, float]:
        """(commands among the words, windows without a word) over 400 windows."""
        ds = KWSWindows(pool, [], window_config(KWSOptions(p_command=p_command)), length=400)
        labels = [ds[i].targets for i in range(400)]
        said = [t[(t != SIL) & (t != IGNORE)] for t in labels]
        words = [int(t[0]) for t in said if len(t)]
        return float(np.mean(np.array(words) < SIL)), sum(not len(t) for t in said) / 400

    cmd_default, empty_default = shares(0.55)
    cmd_low, empty_low = shares(0.3)
    assert 0.5 < cmd_default < 0.7 and 0.22 < cmd_low < 0.4
    assert abs(empty_default - empty_low) < 0.06  # word-less windows stay at their share
    with pytest.raises(ValueError, match="--p-command must be at most 0.85"):
        KWSRecipe(KWSOptions(p_command=0.9), ModelOptions(), TrainConfig())


def test_speed_prob_sets_how_often_a_training_word_is_resampled(monkeypatch):
    import training.data.rooms as rooms
    from training.recipes.kws import KWSOptions, window_config

    assert window_config(KWSOptions(speed_prob=0.0)).room.speed_prob == 0.0
    calls = []
    real = rooms.change_speed

    def spy(a, factor):
        calls.append(factor)
        return real(a, factor)

    monkeypatch.setattr(rooms, "change_speed", spy)
    pool = WordPool.from_voices(_voices())
    for prob in (0.0, 0.7):
        ds = KWSWindows(pool, [], window_config(KWSOptions(speed_prob=prob)), length=100)
        calls.clear()
        words = sum(
            int(((ds[i].targets != SIL) & (ds[i].targets != IGNORE)).any()) for i in range(100)
        )
        assert (len(calls) == 0) if prob == 0 else (len(calls) > 0.4 * words)


def test_reverb_and_clip_prob_set_how_often_a_word_is_reverberated_and_a_window_clipped(
    monkeypatch,
):
    import training.data.rooms as rooms
    import training.data.sc12 as sc12
    from training.data.rooms import RoomConfig
    from training.recipes.kws import KWSOptions, window_config

    assert window_config(KWSOptions(reverb_prob=0.0, clip_prob=0.0)).room == RoomConfig(
        reverb_prob=0.0, clip_prob=0.0
    )
    convolved, peaks = [], []
    real_conv, real_level = rooms.signal.fftconvolve, sc12.level

    def conv_spy(a, rir):
        convolved.append(len(a))
        return real_conv(a, rir)

    def level_spy(x, cfg, rng):
        y = real_level(x, cfg, rng)
        peaks.append(float(np.abs(y).max()))
        return y

    monkeypatch.setattr(rooms.signal, "fftconvolve", conv_spy)
    monkeypatch.setattr(sc12, "level", level_spy)
    pool = WordPool.from_voices(_voices())
    rir = np.zeros(400, np.float32)
    rir[0], rir[200] = 1.0, 0.5
    counts = {}
    for prob in (0.0, 1.0):
        opts = KWSOptions(reverb_prob=prob, clip_prob=prob)
        ds = KWSWindows(pool, [rir], window_config(opts), length=60)
        convolved.clear()
        peaks.clear()
        for i in range(60):
            ds[i]
        counts[prob] = (len(convolved), sum(p >= 1.0 for p in peaks), len(peaks))
    assert counts[0.0][:2] == (0, 0)  # never reverberated, never driven to full scale
    assert counts[1.0][0] > 20  # most windows hold a word, each reverberated
    assert counts[1.0][1] == counts[1.0][2] > 0  # every window clipped at full scale


def test_snr_min_db_sets_the_low_end_of_the_training_windows_snr():
    from training.config import TrainConfig
    from training.data.rooms import RoomConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe, window_config

    assert window_config(KWSOptions()) == WindowConfig()  # the default draws as before
    assert window_config(KWSOptions(snr_min_db=-10.0)).room.snr_db == (-10.0, 30.0)
    assert window_config(KWSOptions(snr_min_db=-10.0)).room == RoomConfig(snr_db=(-10.0, 30.0))
    with pytest.raises(ValueError, match="--snr-min-db must be below 30"):
        KWSRecipe(KWSOptions(snr_min_db=30.0), ModelOptions(), TrainConfig())


def test_onset_max_s_lets_the_first_word_start_later_in_a_longer_window():
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe, window_config

    pool = WordPool.from_voices(_voices())
    stride = WindowConfig().stride

    def first_word_s(cfg: WindowConfig) -> list[float]:
        ds = KWSWindows(pool, [], replace(cfg, p_command=1.0, p_unknown=0.0), length=60)
        out = []
        for i in range(len(ds)):
            t = ds[i][1].numpy()
            out.append(
                float(np.flatnonzero(t != SIL)[0] * stride / 16000) if (t != SIL).any() else 0
            )
        return out

    early = first_word_s(WindowConfig())
    late = first_word_s(WindowConfig(window_s=4.8, onset_max_s=3.0))
    assert max(early) <= 0.9 + 0.03  # a frame after the latest default onset
    assert max(late) > 1.5 and max(late) <= 3.0 + 0.03
    a = KWSWindows(pool, [], WindowConfig(), seed=3, length=2)
    b = KWSWindows(pool, [], WindowConfig(onset_max_s=0.9), seed=3, length=2)
    assert all(torch.equal(a[i][0], b[i][0]) for i in range(2))  # the default draws as before
    assert window_config(KWSOptions(window_s=4.8, onset_max_s=3.0)).onset_max_s == 3.0
    with pytest.raises(ValueError, match="--onset-max-s must be in"):
        KWSRecipe(KWSOptions(onset_max_s=2.4), ModelOptions(), TrainConfig())


class _OnlyFrom(KWSWindows):
    """Windows whose every word comes from the clips of one speaker."""

    speaker = "awb"

    def _pick(self, label: int, rng: np.random.Generator) -> int:
        super()._pick(label, rng)  # the same draws as the parent
        idx = np.flatnonzero((self.pool.labels == label) & (self.pool.speakers == self.speaker))
        return int(idx[0])


def test_domain_targets_name_the_words_engine_from_its_start_to_its_hold() -> None:
    pool = _pool()
    ds = KWSWindows(pool, [], WindowConfig(), seed=3, length=40)
    assert ds.domain_names == ["espeak", "flite"]
    seen = set()
    for i in range(40):
        a = ds[i]
        t, d = a.targets.numpy(), a.domains.numpy()
        word = (t != SIL) & (t != IGNORE)  # a word's hold
        assert (d[word] != IGNORE).all()  # every held label has the word's engine
        w = a.words.numpy()  # the word's label over the same span
        assert ((w != IGNORE) == (d != IGNORE)).all() and (w[word] == t[word]).all()
        if (t == SIL).all():
            assert (d == IGNORE).all()  # a word-less window has no domain
        else:
            first = int(np.flatnonzero(t != SIL)[0])  # the first word's first frame
            assert (d[:first] == IGNORE).all() and d[first] != IGNORE
        seen |= set(d[d != IGNORE].tolist())
    assert seen == {0, 1}
    only = _OnlyFrom(pool, [], WindowConfig(), seed=3, length=40)
    for i in range(10):
        d = only[i].domains.numpy()
        assert set(d[d != IGNORE].tolist()) <= {1}  # flite, awb's engine


def test_a_run_with_more_engines_renders_and_splits_them():
    from training.recipes.kws import KWSOptions, corpus_config

    assert set(MORE_ENGINES) <= set(corpus_config(KWSOptions(more_engines=True), 0).engines)
    assert not set(MORE_ENGINES) & set(corpus_config(KWSOptions(), 0).engines)
