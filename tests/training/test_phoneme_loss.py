"""The auxiliary phoneme loss: the words' phoneme table, CTC against a plain loop, the windows'
phoneme targets, and the recipe adding it without touching the model."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from dlr_runtime.model import frames_of
from training.data.phonemes import (
    BLANK,
    PhonemeTable,
    corpus_words,
    espeak_phonemes,
    load_table,
)
from training.data.sc12 import MAX_PHONES, UNK, KWSWindows, WindowConfig, WordPool
from training.data.vocab import HOMOPHONES, SC12_LABELS
from training.phoneme_loss import (
    PhonemeHead,
    PhonemeLossConfig,
    ctc_reference,
    phoneme_ctc_loss,
)

from .test_kws_data import _voices

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")


def test_the_table_spells_every_corpus_word() -> None:
    table = load_table()
    words = corpus_words()
    assert set(words) <= set(table.words) and len(words) > 400
    assert not set(table.words) & HOMOPHONES
    for w in words:
        ids = table.encode(w)
        assert ids and all(1 <= i <= len(table.inventory) for i in ids)
    assert table.n_classes == len(table.inventory) + 1 and BLANK == 0
    assert table.spell(table.encode("down")) == ["d", "aʊ", "n"]
    assert table.spell(table.encode("dawn")) != table.spell(table.encode("down"))
    assert table.spell([BLANK, *table.encode("go")]) == table.spell(table.encode("go"))
    assert not any(c in p for p in table.inventory for c in "ˈˌ_ ")  # stress and separators gone
    with pytest.raises(KeyError, match="no phonemes for 'zyzzyva'"):
        table.encode("zyzzyva")


def test_the_inventory_is_sorted_and_ids_follow_it() -> None:
    table = PhonemeTable.from_spellings({"b": ["x", "a"], "a": ["a"]})
    assert table.inventory == ("a", "x")
    assert table.words == {"b": (2, 1), "a": (1,)}


@needs_espeak
def test_the_kept_table_is_what_espeak_ng_says_now() -> None:
    table = load_table()
    sample = corpus_words()[::12]  # every 12th word: 41 of 486, "yes" first
    for w in sample:
        assert table.spell(table.encode(w)) == list(espeak_phonemes(w)), (
            f"{w}: espeak-ng spells it otherwise now; python -m training.data.phonemes --write"
        )


def _random_log_probs(b: int, t: int, c: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(b, t, c, generator=g, dtype=dtype) * 2, dim=-1)


def test_ctc_matches_the_plain_loop_in_float64() -> None:
    lp = _random_log_probs(4, 12, 6, 0, torch.float64)  # (B, T, C)
    targets = [[1, 2, 2, 3], [], [5], [4, 1]]  # a repeat, an empty target, one phoneme
    phones = torch.zeros(4, 8, dtype=torch.long)
    for i, t in enumerate(targets):
        phones[i, : len(t)] = torch.tensor(t, dtype=torch.long)
    n = torch.tensor([len(t) for t in targets])
    got = phoneme_ctc_loss(lp, phones, n)
    want = sum(ctc_reference(lp[i], t) / max(1, len(t)) for i, t in enumerate(targets)) / 4
    assert abs(float(got) - float(want)) < 1e-10


def test_windows_without_a_target_are_left_out() -> None:
    lp = _random_log_probs(3, 10, 5, 1, torch.float64)
    phones = torch.tensor([[1, 2, 0], [3, 3, 4], [2, 0, 0]])
    full = phoneme_ctc_loss(lp, phones, torch.tensor([2, 3, 1]))
    cut = phoneme_ctc_loss(lp, phones, torch.tensor([2, -1, 1]))
    want = (ctc_reference(lp[0], [1, 2]) / 2 + ctc_reference(lp[2], [2])) / 2
    assert abs(float(cut) - float(want)) < 1e-10 and abs(float(full - cut)) > 1e-3
    none = phoneme_ctc_loss(lp.requires_grad_(), phones, torch.tensor([-1, -1, -1]))
    assert float(none.detach()) == 0.0
    none.backward()  # a graph, so a batch of cut windows still trains the rest
    assert lp.grad is not None and float(lp.grad.abs().sum()) == 0.0


def test_ctc_in_float32_within_1e_5_relative() -> None:
    lp64 = _random_log_probs(2, 30, 9, 2, torch.float64)
    phones = torch.tensor([[1, 4, 4, 8, 2, 0], [3, 0, 0, 0, 0, 0]])
    n = torch.tensor([5, 1])
    want = float(phoneme_ctc_loss(lp64, phones, n))
    got = float(phoneme_ctc_loss(lp64.float(), phones, n))
    assert abs(got - want) <= 1e-5 * abs(want)


def test_descent_learns_to_spell_a_word() -> None:
    """Free per-frame logits trained with the loss emit the target when decoded greedily."""
    torch.manual_seed(0)
    logits = torch.zeros(1, 20, 7, requires_grad=True)
    phones, n = torch.tensor([[3, 1, 1, 5]]), torch.tensor([4])
    opt = torch.optim.Adam([logits], lr=0.1)
    first = None
    for _ in range(300):
        loss = phoneme_ctc_loss(torch.log_softmax(logits, -1), phones, n)
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.05 * first
    path = logits[0].argmax(-1).tolist()
    decoded = [p for k, p in enumerate(path) if p != BLANK and (k == 0 or p != path[k - 1])]
    assert decoded == [3, 1, 1, 5]


def test_the_head_and_config() -> None:
    head = PhonemeHead(8, 6)
    out = head(torch.randn(2, 5, 8))
    assert out.shape == (2, 5, 6)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(2, 5))
    assert not PhonemeLossConfig().active and PhonemeLossConfig(0.3).active
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="--phoneme-loss-weight must be >= 0"):
            PhonemeLossConfig(bad).check()


def _worded_pool() -> WordPool:
    """The test pool with real words: commands by their label, unknown words from the table."""
    voices = _voices()
    others = ["cat", "house", "dawn", "goat", "seven", "yesterday"]
    for vc in voices:
        vc.words = np.array(
            [SC12_LABELS[lab] if lab != UNK else others[k % len(others)]
             for k, lab in enumerate(vc.labels)]
        )  # fmt: skip
    return WordPool.from_voices(voices)


def test_windows_carry_their_words_phonemes_without_changing_the_window() -> None:
    pool, table = _worded_pool(), load_table()
    plain = KWSWindows(pool, [], WindowConfig(), seed=3, length=300)
    spelled = KWSWindows(pool, [], WindowConfig(), seed=3, length=300, phonemes=table)
    seen = {"cut": 0, "empty": 0, "two": 0}
    for i in range(300):
        a, b = plain[i], spelled[i]
        assert torch.equal(a.audio, b.audio) and torch.equal(a.targets, b.targets)
        assert a.n_phones == -1 and int(a.phones.abs().sum()) == 0  # no table: no target
        assert b.phones.shape == (MAX_PHONES,)
        if b.n_phones < 0:
            seen["cut"] += 1
            continue
        assert int((b.phones[b.n_phones :] != 0).sum()) == 0  # padding
        spans = _word_spans(b.domains)
        assert len(spans) <= 2
        seen["empty"] += not spans
        seen["two"] += len(spans) == 2
        if not spans:
            assert b.n_phones == 0
    assert all(seen.values()), seen  # cut, word-less and two-word windows all occur


def _word_spans(domains: torch.Tensor) -> list[tuple[int, int]]:
    on = (domains != -100).int().tolist()
    spans, start = [], None
    for k, v in enumerate([*on, 0]):
        if v and start is None:
            start = k
        elif not v and start is not None:
            spans.append((start, k))
            start = None
    return spans


def test_a_target_is_the_words_in_order() -> None:
    """Rebuild each window's target from the clips it drew (same seeds, drawn again)."""
    pool, table = _worded_pool(), load_table()
    windows = KWSWindows(pool, [], WindowConfig(p_two_words=1.0), seed=5, length=80)
    spelled = KWSWindows(pool, [], WindowConfig(p_two_words=1.0), seed=5, length=80, phonemes=table)
    picked: list[int] = []
    original = windows._pick

    def spy(label, rng):
        i = original(label, rng)
        picked.append(i)
        return i

    windows._pick = spy  # type: ignore[method-assign]
    checked = 0
    for i in range(80):
        picked.clear()
        windows[i]
        item = spelled[i]
        if item.n_phones < 0:
            continue
        want = [p for j in picked for p in table.encode(str(pool.words[j]))]
        assert item.phones[: item.n_phones].tolist() == want
        checked += len(picked) == 2
    assert checked > 10


def test_the_recipe_adds_the_weighted_ctc_and_keeps_the_model() -> None:
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe, block_features

    small = ModelOptions(d_model=8, d_state=4, n_layers=1)
    plain = KWSRecipe(KWSOptions(vtlp=False), small, TrainConfig())
    spelled = KWSRecipe(KWSOptions(vtlp=False, phoneme_loss_weight=0.4), small, TrainConfig())
    assert plain.auxiliary() is None
    head = spelled.auxiliary()
    assert isinstance(head, PhonemeHead)
    windows = KWSWindows(_worded_pool(), [], WindowConfig(), seed=1, length=16,
                         phonemes=load_table())  # fmt: skip
    batch = default_collate([windows[i] for i in range(16)])
    model = plain.build_model()
    keys = set(model.state_dict())
    base, _ = plain.loss(model, batch, torch.device("cpu"))
    both, _ = spelled.loss(model, batch, torch.device("cpu"))
    with torch.no_grad():
        cfg = model.config
        frames = model.encoder.frontend(frames_of(batch.audio, cfg.frame_stride, cfg.history))
        want = phoneme_ctc_loss(head(block_features(model, frames)), batch.phones, batch.n_phones)
    assert float(want) > 0
    assert abs(float((both - base).detach()) - 0.4 * float(want)) < 1e-5
    assert set(model.state_dict()) == keys  # the head is not part of the model
    assert spelled.training_metrics()["phoneme_loss"] == pytest.approx(float(want), rel=1e-5)
    with pytest.raises(ValueError, match="--phoneme-loss-weight must be >= 0"):
        KWSRecipe(KWSOptions(phoneme_loss_weight=-1.0), small, TrainConfig())


def test_the_head_can_read_an_earlier_block() -> None:
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe, block_outputs

    two = ModelOptions(d_model=8, d_state=4, n_layers=2)
    plain = KWSRecipe(KWSOptions(vtlp=False), two, TrainConfig())
    opts = KWSOptions(vtlp=False, phoneme_loss_weight=1.0, phoneme_loss_block=1)
    first = KWSRecipe(opts, two, TrainConfig())
    head = first.auxiliary()
    windows = KWSWindows(_worded_pool(), [], WindowConfig(), seed=2, length=8,
                         phonemes=load_table())  # fmt: skip
    batch = default_collate([windows[i] for i in range(8)])
    model = plain.build_model()
    base, _ = plain.loss(model, batch, torch.device("cpu"))
    both, _ = first.loss(model, batch, torch.device("cpu"))
    with torch.no_grad():
        cfg = model.config
        frames = model.encoder.frontend(frames_of(batch.audio, cfg.frame_stride, cfg.history))
        outs = block_outputs(model, frames)
        want = phoneme_ctc_loss(head(outs[0]), batch.phones, batch.n_phones)
        last = phoneme_ctc_loss(head(outs[1]), batch.phones, batch.n_phones)
    assert abs(float((both - base).detach()) - float(want)) < 1e-5
    assert abs(float(want - last)) > 1e-4  # the two blocks differ, so the choice is seen
    with pytest.raises(ValueError, match=r"--phoneme-loss-block must be in \[0, --n-layers 2\]"):
        KWSRecipe(KWSOptions(phoneme_loss_block=3), two, TrainConfig())
