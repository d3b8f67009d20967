"""Minimal-pair windows (data/sc12.py ``p_pair``) and the pair loss (training/pair_loss.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import training.data.sc12 as sc12
from tests.training.test_kws_data import AudioSpy, _voices
from training.config import TrainConfig
from training.data.sc12 import (
    IGNORE,
    MAX_PHONES,
    SIL,
    UNK,
    KWSItem,
    KWSWindows,
    WindowConfig,
    WordPool,
    near_miss_commands,
)
from training.data.vocab import NEAR_MISSES_OF, SC12_LABELS
from training.modelopts import ModelOptions
from training.pair_loss import pair_gaps, pair_margin_loss, pair_margin_loss_reference
from training.recipes.kws import KWSOptions, KWSRecipe

UP, DOWN, ON, NO = (SC12_LABELS.index(c) for c in ("up", "down", "on", "no"))


def pair_targets(gen: torch.Generator, b: int, f: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Targets (b, f) with a command run and an `_unknown_` run in most rows; the pair's command
    (b,) (-1 in the last row, which is not a pair; row 0 has no `_unknown_` frame)."""
    targets = torch.full((b, f), SIL)
    cmd = torch.randint(0, SIL, (b,), generator=gen)
    for r in range(b):
        a, z = sorted(torch.randint(0, f, (2,), generator=gen).tolist())
        targets[r, a : a + 5] = int(cmd[r])
        targets[r, a + 5 : a + 7] = IGNORE
        if r > 0:
            targets[r, z : z + 4] = UNK
    pair_cmd = cmd.clone()
    pair_cmd[-1] = -1
    return targets, pair_cmd


@pytest.mark.parametrize("margin", [0.0, 6.0])
def test_pair_loss_matches_the_reference_loop_in_float64(margin):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, len(SC12_LABELS), generator=gen, dtype=torch.float64) * 3
    targets, pair_cmd = pair_targets(gen, 6, 40)
    fast = pair_margin_loss(logits.double(), targets, pair_cmd, UNK, margin)
    ref = pair_margin_loss_reference(logits, targets, pair_cmd, UNK, margin)
    assert abs(float(fast) - float(ref)) < 1e-10
    # the rows without both words (row 0) or without a pair (the last) are left out
    assert pair_gaps(logits, targets, pair_cmd, UNK).shape == (4,)


def test_pair_loss_is_relative_and_pushes_the_pair_apart():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 30, len(SC12_LABELS), generator=gen, dtype=torch.float64)
    targets, pair_cmd = pair_targets(gen, 5, 30)
    base = pair_margin_loss(logits, targets, pair_cmd, UNK, 6.0)
    # a voice-wide offset of the command's log-odds costs nothing
    shifted = logits.clone()
    for r in range(5):
        if pair_cmd[r] >= 0:
            shifted[r, :, int(pair_cmd[r])] += 4.0
    assert abs(float(pair_margin_loss(shifted, targets, pair_cmd, UNK, 6.0) - base)) < 1e-10
    # its gradient raises the command's score on the command's frames, lowers it on the near
    # miss's, and leaves the other frames alone
    x = logits.clone().requires_grad_(True)
    pair_margin_loss(x, targets, pair_cmd, UNK, 6.0).backward()
    r, c = 2, int(pair_cmd[2])
    on_cmd, on_near = targets[r] == c, targets[r] == UNK
    assert (x.grad[r, on_cmd, c] < 0).all() and (x.grad[r, on_near, c] > 0).all()
    assert (x.grad[r, ~(on_cmd | on_near)] == 0).all()
    assert (x.grad[-1] == 0).all()  # not a pair window
    # no pair in the batch: zero, with a graph
    none = pair_margin_loss(x, targets, torch.full((5,), -1), UNK, 6.0)
    assert float(none.detach()) == 0.0 and none.requires_grad


def test_near_miss_commands_come_from_both_lists():
    commands = near_miss_commands()
    assert commands["app"] == (UP,) and commands["now"] == (NO,)
    assert set(commands["dawn"]) == {DOWN, ON}  # near two commands
    assert all(w in commands for ws in NEAR_MISSES_OF.values() for w in ws)
    assert len(commands) > len({w for ws in NEAR_MISSES_OF.values() for w in ws})  # dictionary


def _pair_pool() -> WordPool:
    """Two voices: voice 0 says "app" and "now", voice 1 "dawn"; the rest are other words."""
    words = (["app", "cat", "now", "house", "bird", "tree"], ["dawn"] + ["cat"] * 5)
    voices = []
    for vc, ws in zip(_voices(), words, strict=True):
        w = vc.words.copy()
        w[vc.labels == UNK] = ws
        voices.append(replace(vc, words=w))
    return WordPool.from_voices(voices)


def test_pair_windows_hold_a_command_and_its_near_miss_from_one_voice():
    pool = _pair_pool()

    spy = AudioSpy.of(pool)
    ds = KWSWindows(spy, [], WindowConfig(p_pair=1.0), seed=4, length=200)
    kinds = set()
    for k in range(200):
        spy.calls = []
        item = ds[k]
        said = [i for i, _ in spy.calls[:-12]]  # (the window's 12 babble clips come last)
        if not said:  # a word-less window
            assert item.pair_cmd == -1
            continue
        assert len(said) == 2
        near = [i for i in said if pool.labels[i] == UNK]
        cmd = [i for i in said if pool.labels[i] != UNK]
        assert len(near) == len(cmd) == 1
        assert pool.voices[near[0]] == pool.voices[cmd[0]]
        assert item.pair_cmd == pool.labels[cmd[0]]
        assert item.pair_cmd in near_miss_commands()[str(pool.words[near[0]])]
        kinds.add((str(pool.words[near[0]]), int(item.pair_cmd)))
        assert {int(item.pair_cmd), UNK} <= set(item.targets.tolist())
    assert kinds == {("app", UP), ("now", NO), ("dawn", DOWN), ("dawn", ON)}


def test_both_words_of_a_pair_get_the_same_effects(monkeypatch):
    pool = _pair_pool()
    ds = KWSWindows(pool, [np.array([1.0, 0.0, 0.5, 0.25], np.float32)], WindowConfig(p_pair=1.0))
    states: list[int] = []
    real = sc12.word_effects

    def spy(word, cfg, rirs, rng):
        states.append(rng.bit_generator.state["state"]["state"])
        return real(word, cfg, rirs, rng)

    monkeypatch.setattr(sc12, "word_effects", spy)
    pairs = 0
    for k in range(20):
        states.clear()
        if ds[k].pair_cmd >= 0:
            pairs += 1
            assert len(states) == 2 and states[0] == states[1]
    assert pairs > 10


def test_pairs_asked_of_a_pool_without_them_are_refused():
    pool = WordPool.from_voices(_voices())  # its unknown words are no near miss
    with pytest.raises(ValueError, match="p_pair > 0 needs near misses"):
        KWSWindows(pool, [], WindowConfig(p_pair=0.5))


def test_no_pair_windows_by_default():
    ds = KWSWindows(_pair_pool(), [], WindowConfig(), length=50)
    assert not ds.pair_near and all(ds[k].pair_cmd == -1 for k in range(50))


def test_the_recipe_adds_the_weighted_pair_loss_and_refuses_it_without_pairs():
    small = ModelOptions(d_model=8, d_state=4, n_layers=1)
    with pytest.raises(ValueError, match="--p-pair"):
        KWSRecipe(KWSOptions(pair_loss_weight=1.0), small, TrainConfig())
    with pytest.raises(ValueError, match="--p-pair must be"):
        KWSRecipe(KWSOptions(p_pair=1.5), small, TrainConfig())
    with pytest.raises(ValueError, match="--pair-loss-weight must be >= 0"):
        KWSRecipe(KWSOptions(p_pair=0.5, pair_loss_weight=-1.0), small, TrainConfig())
    with pytest.raises(ValueError, match="--pair-margin must be >= 0"):
        KWSRecipe(KWSOptions(p_pair=0.5, pair_margin=-1.0), small, TrainConfig())
    plain = KWSRecipe(KWSOptions(vtlp=False, p_pair=1.0), small, TrainConfig())
    paired = KWSRecipe(
        KWSOptions(vtlp=False, p_pair=1.0, pair_loss_weight=0.5, pair_margin=3.0),
        small,
        TrainConfig(),
    )
    model = plain.build_model()
    gen = torch.Generator().manual_seed(0)
    targets, pair_cmd = pair_targets(gen, 3, 50)
    audio = torch.randn(3, 16000, generator=gen) * 0.1
    no_word = torch.full_like(targets, IGNORE)
    batch = KWSItem(
        audio,
        targets,
        torch.ones(3),
        no_word,
        no_word,
        torch.zeros(3, MAX_PHONES, dtype=torch.long),
        torch.full((3,), -1),
        pair_cmd,
        targets,
    )
    base, _ = plain.loss(model, batch, torch.device("cpu"))
    both, _ = paired.loss(model, batch, torch.device("cpu"))
    with torch.no_grad():
        expected = pair_margin_loss(model(audio), targets, pair_cmd, UNK, 3.0)
    assert float(expected) > 0
    assert abs(float((both - base).detach()) - 0.5 * float(expected)) < 1e-5
    # the pair windows' gap is reported with or without the loss
    assert "pair_gap" in plain.training_metrics()
