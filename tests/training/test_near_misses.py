"""The dictionary's near misses of the commands (training/data/near_misses.py) and their corpus
layer (corpus.near_miss_layer): what the committed list may hold, how it is found, and that
the layer reaches the training voices only."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from training.data.corpus import (
    CorpusConfig,
    VoiceClips,
    cache_key,
    near_miss_layer,
    voice_items,
)
from training.data.engines import FLITE_VOICES, TTSVoice
from training.data.labels import SC10_LABELS
from training.data.near_misses import (
    CMU_MERGE,
    CMUDICT,
    POSLEX,
    candidates,
    edit_distance,
    extra_near_misses,
    extra_words,
    from_dictionaries,
    merged,
    parse_cmudict,
    parse_poslex,
)
from training.data.sc12 import UNK, KWSWindows, WindowConfig, WordPool
from training.data.vocab import HOMOPHONES, SC12_LABELS, UNKNOWN, unknown_words


def test_committed_list_holds_new_words_only():
    near = extra_near_misses()
    assert set(near) == set(SC10_LABELS)
    words = [w for ws in near.values() for w in ws]
    assert len(words) == len(set(words)) == len(extra_words()) >= 150
    assert all(w.isalpha() and w.islower() for w in words)
    assert not set(words) & (set(SC10_LABELS) | HOMOPHONES | set(unknown_words()))


def test_edit_distance_and_mergers():
    assert edit_distance(("ah", "p"), ("ae", "p")) == 1
    assert edit_distance(("s", "t", "aa", "p"), ("t", "aa", "p")) == 1
    assert edit_distance(("d", "aw", "n"), ("d", "aw", "n")) == 0
    assert edit_distance((), ("g", "ow")) == 2
    assert merged(("d", "ao", "n"), CMU_MERGE) == ("d", "aa", "n")  # cot / caught


PRONS = {
    "up": [("ah", "p")],
    "on": [("aa", "n")],
    "yes": [("y", "eh", "s")],
    "yup": [("y", "ah", "p")],  # one phone from up
    "awn": [("ao", "n")],  # on, under the cot / caught merger: a homophone
    "upp": [("ax", "p")],  # up with a reduced vowel: a homophone
    "jess": [("jh", "eh", "s")],  # one phone from yes, a name
    "nest": [("n", "eh", "s")],  # (pronounced "ness" here) one phone from yes, a word
    "best": [("b", "eh", "s", "t")],  # two from yes, its vowel kept
    "bus": [("b", "ah", "s")],  # two from yes, another vowel
    "kit": [("k", "ih", "t")],  # far from everything
}


def _candidates():
    prons = {**{c: [("zz", c)] for c in SC10_LABELS}, **PRONS}  # the others far away
    freq = {w: (1 if w == "jess" else 0, float(i)) for i, w in enumerate(PRONS)}
    freq["nest"] = (0, 99.0)  # a rare common word still comes before a name
    return candidates(prons, freq, per_command=5)


def test_candidates_keep_one_phone_neighbours_and_drop_homophones():
    near = _candidates()
    assert near["up"] == ["yup"]
    assert near["on"] == []  # "awn" is "on" for most Americans
    assert "upp" not in sum(near.values(), [])
    assert near["yes"] == ["nest", "jess", "best"]  # distance 1 (words, then names), then 2
    assert "kit" not in sum(near.values(), []) and "bus" not in sum(near.values(), [])


def test_words_of_the_vocabulary_are_never_candidates():
    near = _candidates()
    prons = {**{c: [("zz", c)] for c in SC10_LABELS}, "now": [("n", "aw")], "no": [("n", "ow")]}
    assert "now" in unknown_words()
    assert candidates(prons, {"now": (0, 0.0)}) == {c: [] for c in SC10_LABELS}
    assert near  # (the fixture itself found words)


def test_dictionary_parsers():
    prons = parse_cmudict(
        ['("up" nil (((ah p) 1)))', '("aaron" nil (((eh) 1) ((r ax n) 0)))', "MNCL"]
    )
    assert prons == {"up": [("ah", "p")], "aaron": [("eh", "r", "ax", "n")]}
    tags = parse_poslex(
        ['("don" ((nnp -8.694) (vb -10.141) ) () )', '("stahl" ((nnp -11.403) ) () )']
    )
    assert tags == {"don": (0, 10.141), "stahl": (1, 11.403)}


@pytest.mark.skipif(
    not (CMUDICT.exists() and POSLEX.exists() and shutil.which("espeak-ng")),
    reason="needs festlex-cmu, festlex-poslex and espeak-ng",
)
def test_committed_list_is_what_the_dictionaries_give():
    assert from_dictionaries() == {c: list(ws) for c, ws in extra_near_misses().items()}


def test_the_layer_is_unknown_words_only_and_cached_apart():
    base = CorpusConfig()
    words = extra_words()[:30]
    layer = near_miss_layer(base, words)
    for voice in (TTSVoice("espeak", "en-us+m1", "espeak-m1"), FLITE_VOICES[0]):
        items = voice_items(layer, voice)
        assert items and all(i.label == SC12_LABELS.index(UNKNOWN) for i in items)
        assert {i.word for i in items} <= set(words)
        assert cache_key(layer, voice) != cache_key(base, voice)
    # the main corpus is unchanged by the new field: its commands come first, as before
    items = voice_items(base, FLITE_VOICES[0])
    assert [i.word for i in items[: base.command_renditions]] == [SC10_LABELS[0]] * 12
    assert voice_items(replace(base, commands=True), FLITE_VOICES[0]) == items
    assert len(voice_items(layer, FLITE_VOICES[0])) == len(words)  # each word once


def _tone_pool(unknown: list[str]) -> WordPool:
    """Two voices of tones: each command once, then one clip per unknown word."""
    voices = []
    for k, engine in enumerate(("espeak", "flite")):
        labels = [*range(len(SC10_LABELS)), *[UNK] * len(unknown)]
        clips = [np.full(800 + 10 * i, 1000 * (k + 1), np.int16) for i in range(len(labels))]
        voices.append(
            VoiceClips(
                TTSVoice(engine, f"v{k}", f"s{k}"),
                np.concatenate(clips),
                np.concatenate([[0], np.cumsum([len(c) for c in clips])]),
                np.array(labels),
                np.array([*SC10_LABELS, *unknown]),
            )
        )
    return WordPool.from_voices(voices)


def test_p_near_miss_draws_the_dictionary_words_too():
    extra = extra_words()[:3]
    pool = _tone_pool(["now", "cat", "house", *extra])
    ds = KWSWindows(pool, [], WindowConfig(p_near_miss=1.0), length=1)
    rng = np.random.default_rng(0)
    picks = {str(pool.words[ds._pick(UNK, rng)]) for _ in range(400)}
    assert picks == {"now", *extra}


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("espeak-ng") is None or shutil.which("flite") is None,
    reason="needs espeak-ng and flite",
)
def test_only_training_voices_say_the_dictionary_words(tmp_path):
    from training.recipes.kws import KWSOptions, load_split

    opts = KWSOptions(cache_dir=str(tmp_path), tiny_corpus=True, workers=1)
    plain = load_split(opts, seed=0)
    pools = load_split(replace(opts, extra_near_misses=True), seed=0)
    extra = set(extra_words())
    train = pools["train"]
    added = np.isin(train.words, list(extra))
    assert added.any() and (train.labels[added] == UNK).all()
    assert len(train) == len(plain["train"]) + int(added.sum())
    assert set(train.voices[added]) <= set(plain["train"].voices)
    for name in ("valid", "test"):
        assert not np.isin(pools[name].words, list(extra)).any()
        assert len(pools[name]) == len(plain[name])


def test_the_phoneme_loss_refuses_the_dictionary_words():
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe

    with pytest.raises(ValueError, match="not in it"):
        opts = KWSOptions(extra_near_misses=True, phoneme_loss_weight=0.1)
        KWSRecipe(opts, ModelOptions(), TrainConfig())


def test_clip_report_splits_the_unknown_words_into_near_misses_and_others():
    from training.eval_speech import clip_report

    words = np.array(["up", "dawn", "goat", "cat", "house", "tree", "bird"])
    labels = np.array([SC10_LABELS.index("up"), UNK, UNK, UNK, UNK, UNK, UNK])
    pred = np.array([SC10_LABELS.index("up"), SC10_LABELS.index("down"), UNK, 0, UNK, UNK, UNK])
    engines = voices = np.array(["espeak"] * 7)
    rep = clip_report(pred, labels, engines, voices, words)
    assert rep["unknown_accepted"] == 2 / 6
    assert rep["unknown_accepted_near_miss"] == 1 / 2 and rep["unknown_clips_near_miss"] == 2
    assert rep["unknown_accepted_other_word"] == 1 / 4 and rep["unknown_clips_other_word"] == 4
    assert "unknown_accepted_near_miss" not in clip_report(pred, labels, engines, voices)


def test_regenerating_without_a_dictionary_names_the_package(tmp_path, monkeypatch):
    import training.data.near_misses as nm

    monkeypatch.setattr(nm, "CMUDICT", tmp_path / "missing.out")
    with pytest.raises(RuntimeError, match="apt-get install festlex-cmu"):
        nm.from_dictionaries()
