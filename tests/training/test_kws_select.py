"""--select: which valid metric keeps a kws run's model/."""

from __future__ import annotations

import pytest

from training.config import TrainConfig
from training.modelopts import ModelOptions
from training.recipes.kws import KWSOptions, KWSRecipe, clip_metrics

SMALL = ModelOptions(d_model=8, d_state=4, n_layers=1)


def test_the_selection_metric_is_the_recipes_primary() -> None:
    import torch

    assert KWSRecipe(KWSOptions(), SMALL, TrainConfig()).primary == "accuracy"
    chosen = KWSRecipe(KWSOptions(select="command_accuracy"), SMALL, TrainConfig())
    assert chosen.primary == "command_accuracy" and chosen.higher_is_better
    assert KWSRecipe.primary == "accuracy"  # the class default is untouched
    # the key exists in what evaluate() returns (clip_metrics is its core)
    scores = torch.eye(12)[torch.tensor([0, 11, 10])]
    assert chosen.primary in clip_metrics(scores, torch.tensor([0, 11, 10]))


def test_an_unknown_selection_metric_is_refused() -> None:
    with pytest.raises(ValueError, match="--select must be one of accuracy, command_accuracy"):
        KWSRecipe(KWSOptions(select="false_accept"), SMALL, TrainConfig())
