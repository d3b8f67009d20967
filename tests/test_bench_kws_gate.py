"""benchmarks/bench_kws_gate.py splits the gate's recall cost into words it never opened on and
words it opened on."""

from __future__ import annotations

import numpy as np

from benchmarks.bench_kws_gate import opened, recall_split
from dlr_runtime.kws import KWSConfig
from training.data.sc12 import SC12_LABELS, SIL, UNK
from training.streams import Event, Stream

STRIDE = 320
FRAME_MS = 20.0


def _stream() -> tuple[np.ndarray, Stream]:
    """Three words over 300 frames: "yes" (frames 20-40) and "no" (frames 100-120) commands,
    an unknown word (frames 200-220). The gate skipped the "yes"; the model is sure of the
    "no" after it ends."""
    labels = list(SC12_LABELS)
    events = [
        Event(labels.index("yes"), "yes", "v", 20 * STRIDE, 40 * STRIDE),
        Event(labels.index("no"), "no", "v", 100 * STRIDE, 120 * STRIDE),
        Event(UNK, "cat", "v", 200 * STRIDE, 220 * STRIDE),
    ]
    scores = np.zeros((300, len(labels)))
    scores[:, SIL] = 10.0  # quiet
    scores[10:50] = -np.inf  # skipped by the gate: the quiet posterior
    scores[10:50, SIL] = 0.0
    scores[115:140, SIL] = 0.0
    scores[115:140, labels.index("no")] = 20.0
    return scores, Stream(np.zeros(300 * STRIDE, np.float32), events)


def test_opened_marks_commands_with_no_computed_frame() -> None:
    scores, stream = _stream()
    assert opened(scores, stream, STRIDE) == [False, True]  # commands only, in order


def test_recall_split_scores_only_the_words_the_gate_opened_on() -> None:
    scores, stream = _stream()
    point = KWSConfig(threshold=0.8, smooth_ms=60.0)
    unopened, recall = recall_split([(scores, stream)], list(SC12_LABELS), FRAME_MS, point, STRIDE)
    assert unopened == 0.5
    assert recall == 1.0
    scores[115:140, SC12_LABELS.index("no")] = 0.0  # now the model misses the "no" as well
    assert recall_split([(scores, stream)], list(SC12_LABELS), FRAME_MS, point, STRIDE) == (
        0.5,
        0.0,
    )
