"""The evaluation's rejection sweep (training/eval_speech.py): the model's own trade between
commands found and unknown words accepted as a bias on the `_unknown_` logit moves."""

from __future__ import annotations

import numpy as np
import torch

from training.data.sc12 import UNK
from training.eval_speech import SWEEP_BIASES, commands_within, plot_rejection, rejection_sweep


def _scores() -> tuple[torch.Tensor, np.ndarray]:
    """Two command clips and two unknown-word clips whose `_unknown_` margins differ."""
    scores = torch.zeros(4, 12)
    labels = np.array([0, 1, UNK, UNK])
    scores[0, 0], scores[0, UNK] = 3.0, 1.0  # a command, 2 above unknown
    scores[1, 1], scores[1, UNK] = 1.5, 1.0  # a command, 0.5 above unknown
    scores[2, 2], scores[2, UNK] = 2.0, 1.0  # an unknown word taken for a command by 1
    scores[3, UNK] = 1.0  # an unknown word rejected
    return scores, labels


def test_the_sweep_trades_commands_for_rejection_monotonically():
    pts = rejection_sweep(*_scores())
    assert [p["unknown_bias"] for p in pts] == list(SWEEP_BIASES)
    at = {p["unknown_bias"]: p for p in pts}
    assert (at[0.0]["command_accuracy"], at[0.0]["unknown_accepted"]) == (1.0, 0.5)
    assert (at[1.2]["command_accuracy"], at[1.2]["unknown_accepted"]) == (0.5, 0.0)
    assert (at[2.5]["command_accuracy"], at[2.5]["unknown_accepted"]) == (0.0, 0.0)
    assert (at[-3.0]["command_accuracy"], at[-3.0]["unknown_accepted"]) == (1.0, 1.0)
    found = [p["command_accuracy"] for p in pts]
    accepted = [p["unknown_accepted"] for p in pts]
    assert found == sorted(found, reverse=True) and accepted == sorted(accepted, reverse=True)


def test_commands_within_reads_the_curve(tmp_path):
    pts = rejection_sweep(*_scores())
    assert commands_within(pts, 0.5) == 1.0
    assert commands_within(pts, 0.0) == 0.5  # the bias that rejects both unknown words
    assert commands_within([p for p in pts if p["unknown_accepted"] > 0.4], 0.1) is None
    plot_rejection({"clean": pts}, tmp_path / "r.png", "sweep")
    assert (tmp_path / "r.png").stat().st_size > 0
