"""`dlr-train kws --unknown-classes`: each unknown word of the corpus its own class of the head,
`_unknown_` their union (dlr_runtime/unknown_head.py).

- the recipe builds a union head over the corpus's unknown words and scores its cross-entropy
  over the classes: from a model split to the union (`training.split_unknown`), whose classes
  are equal copies, an unknown word's frame costs exactly log K more than with one class;
- `training.split_unknown` keeps the outputs and refuses what it cannot split.
The end-to-end run (split, fine-tune, evaluation) is in test_kws_recipe.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from dlr_runtime import save_checkpoint
from dlr_runtime.unknown_head import UnionLinear
from training.config import TrainConfig
from training.data.sc12 import IGNORE, MAX_PHONES, UNK, KWSItem
from training.data.vocab import SC12_LABELS, unknown_words
from training.modelopts import ModelOptions
from training.recipes.kws import KWSOptions, KWSRecipe
from training.split_unknown import main as split_main
from training.split_unknown import split

SMALL = ModelOptions(d_model=8, d_state=4, n_layers=1)


def batch(targets: torch.Tensor, classes: torch.Tensor) -> KWSItem:
    b = targets.shape[0]
    audio = 0.1 * torch.randn(b, 320 * targets.shape[1], generator=torch.Generator().manual_seed(1))
    no_word = torch.full_like(targets, IGNORE)
    none = torch.full((b,), -1)
    phones = torch.zeros(b, MAX_PHONES, dtype=torch.long)
    return KWSItem(audio, targets, torch.ones(b), no_word, no_word, phones, none, none, classes)


def test_the_union_loss_is_over_the_classes():
    opts = KWSOptions(vtlp=False, label_smoothing=0.0)
    plain = KWSRecipe(opts, SMALL, TrainConfig())
    union = KWSRecipe(KWSOptions(vtlp=False, label_smoothing=0.0, unknown_classes=True), SMALL,
                      TrainConfig())  # fmt: skip
    k = len(unknown_words())
    assert union.unknown_vocab == unknown_words() and not plain.unknown_vocab
    model = plain.build_model()
    fine = split(model, k)
    assert isinstance(fine.head.proj, UnionLinear) and fine.config == union.build_model().config
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(0, len(SC12_LABELS), (3, 40), generator=g)
    targets[:, :5] = IGNORE
    classes = targets.clone()
    unk = targets == UNK
    classes[unk] = UNK + torch.randint(0, k, (int(unk.sum()),), generator=g)
    item = batch(targets, classes)
    base, _ = plain.loss(model, item, torch.device("cpu"))
    ours, _ = union.loss(fine, item, torch.device("cpu"))
    counted = targets != IGNORE
    share = float(unk.sum()) / float(counted.sum())
    assert abs(float((ours - base).detach()) - share * math.log(k)) < 1e-4
    # the union head's loss moves with the word: a class's own logit up lowers it
    with torch.no_grad():
        fine.head.proj.bias[int(classes[unk][0])] += 2.0
    moved, _ = union.loss(fine, batch(targets, classes), torch.device("cpu"))
    assert float(moved.detach()) < float(ours.detach())


def test_split_unknown_refuses_what_it_cannot_split(tmp_path, capsys):
    plain = KWSRecipe(KWSOptions(vtlp=False), SMALL, TrainConfig()).build_model()
    twice = split(plain, 4)
    with pytest.raises(ValueError, match="already a union of 4"):
        split(twice, 4)
    with pytest.raises(ValueError, match="--classes must be >= 1"):
        split(plain, 0)
    save_checkpoint(twice, tmp_path / "union")
    with pytest.raises(SystemExit) as exit_:
        split_main([str(tmp_path / "union"), "--out", str(tmp_path / "x")])
    assert exit_.value.code == 2 and not (tmp_path / "x").exists()
    assert "already a union" in capsys.readouterr().err
