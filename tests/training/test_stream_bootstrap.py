"""Error bars on stream figures: per-piece counts, the recall at a false-accept target (the same
rule as the operating point's, checked against it), and the paired bootstrap over pieces."""

from __future__ import annotations

import numpy as np
import pytest

from training.operating_point import global_point
from training.stream_bootstrap import (
    at_threshold,
    compare,
    piece_counts,
    point_intervals,
    recall_at_targets,
    resample_weights,
)
from training.streams import StreamScore

THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95)


def random_pieces(rng: np.random.Generator, n: int, skill: float = 0.8) -> list[list[StreamScore]]:
    """n pieces of 5 minutes: detections and false accepts fall as the threshold rises."""
    out = []
    for _ in range(n):
        cmds = int(rng.integers(20, 60))
        det = np.sort(rng.binomial(cmds, skill * np.linspace(1.0, 0.6, len(THRESHOLDS))))[::-1]
        fa = np.sort(rng.poisson(np.linspace(4.0, 0.1, len(THRESHOLDS))))[::-1]
        out.append(
            [
                StreamScore(t, cmds, int(d), int(f), 5 / 60, [])
                for t, d, f in zip(THRESHOLDS, det, fa, strict=True)
            ]
        )
    return out


def summed(pieces: list[list[StreamScore]]) -> list[StreamScore]:
    """The sweep over all pieces at once (what dlr-eval's `sweep` returns)."""
    return [
        StreamScore(
            t,
            sum(p[k].commands for p in pieces),
            sum(p[k].detected for p in pieces),
            sum(p[k].false_accepts for p in pieces),
            sum(p[k].hours for p in pieces),
            [],
        )
        for k, t in enumerate(THRESHOLDS)
    ]


@pytest.mark.parametrize("seed", range(10))
def test_recall_at_a_target_is_the_operating_point_rule(seed):
    rng = np.random.default_rng(seed)
    pieces = random_pieces(rng, 12)
    c = piece_counts(pieces)
    targets = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 1000.0]
    got = recall_at_targets(c, targets)[0]
    want = [global_point(summed(pieces), t).recall for t in targets]
    np.testing.assert_allclose(got, want)
    # a resample is the sweep of the pieces it draws, repeats included
    w = resample_weights(c.pieces, 5, seed)
    for b in range(5):
        drawn = [p for p, k in zip(pieces, w[b], strict=True) for _ in range(int(k))]
        want = [global_point(summed(drawn), t).recall for t in targets]
        np.testing.assert_allclose(recall_at_targets(c, targets, w[b : b + 1])[0], want)


def test_resamples_draw_every_piece_count_once_per_piece():
    w = resample_weights(12, 300, seed=3)
    assert w.shape == (300, 12)
    assert np.all(w.sum(1) == 12)
    assert w.min() >= 0 and len(np.unique(w[:, 0])) > 2  # pieces repeat and drop out


def test_a_model_against_itself_differs_by_exactly_nothing():
    c = piece_counts(random_pieces(np.random.default_rng(0), 12))
    cmp = compare({"a": c, "b": c}, [2.0, 10.0], resamples=500)
    for iv in cmp.diff["b"] + [cmp.mean_diff["b"]]:
        assert iv.value == iv.low == iv.high == 0.0
    assert cmp.p_better["b"] == 0.0
    assert cmp.recall["a"][1].low <= cmp.recall["a"][1].value <= cmp.recall["a"][1].high


def test_a_clearly_better_model_is_told_apart_and_a_noisy_one_is_not():
    rng = np.random.default_rng(1)
    base = random_pieces(rng, 24, skill=0.7)
    better = [  # every piece finds more commands at every threshold, same false accepts
        [StreamScore(s.threshold, s.commands, min(s.commands, s.detected + s.commands // 5),
                     s.false_accepts, s.hours, []) for s in p]
        for p in base
    ]  # fmt: skip
    cmp = compare({"base": piece_counts(base), "better": piece_counts(better)}, [5.0, 10.0])
    assert cmp.mean_diff["better"].low > 0 and cmp.p_better["better"] > 0.99
    # the same recipe's second run: different pieces' luck, the same skill
    other = random_pieces(np.random.default_rng(2), 24, skill=0.7)
    for p, q in zip(
        other, base, strict=True
    ):  # scored on the same streams: same commands per piece
        for s, r in zip(p, q, strict=True):
            s.commands, s.detected = r.commands, min(r.commands, s.detected)
    cmp = compare({"base": piece_counts(base), "rerun": piece_counts(other)}, [5.0, 10.0])
    assert cmp.mean_diff["rerun"].low < 0 < cmp.mean_diff["rerun"].high


def test_models_on_other_streams_are_refused():
    rng = np.random.default_rng(0)
    a, b = piece_counts(random_pieces(rng, 12)), piece_counts(random_pieces(rng, 12))
    with pytest.raises(ValueError, match="other streams"):
        compare({"a": a, "b": b}, [10.0])
    with pytest.raises(ValueError, match="numbers of pieces"):
        compare({"a": a, "c": piece_counts(random_pieces(rng, 6))}, [10.0])


def test_piece_counts_checks_its_sweeps():
    rng = np.random.default_rng(0)
    pieces = random_pieces(rng, 3)
    with pytest.raises(ValueError, match="ascending"):
        piece_counts([p[::-1] for p in pieces])
    bad = [list(p) for p in pieces]
    bad[1] = bad[1][:-1]
    with pytest.raises(ValueError, match="other thresholds"):
        piece_counts(bad)
    with pytest.raises(ValueError, match="no pieces"):
        piece_counts([])


def test_comparison_round_trips_to_json_types():
    import json

    c = piece_counts(random_pieces(np.random.default_rng(4), 12))
    d = compare({"a": c, "b": c}, [10.0], resamples=100).to_dict()
    assert json.loads(json.dumps(d))["models"]["b"]["p_better_than_first"] == 0.0
    assert "diff_from_first" not in d["models"]["a"]


def test_a_fixed_threshold_scores_as_the_summed_sweep():
    pieces = random_pieces(np.random.default_rng(5), 12)
    c = piece_counts(pieces)
    for k, t in enumerate(THRESHOLDS):
        recall, fa = at_threshold(c, t)
        assert recall[0] == pytest.approx(summed(pieces)[k].recall)
        assert fa[0] == pytest.approx(summed(pieces)[k].fa_per_hour)
    r, f = point_intervals(c, 0.8, resamples=300)
    assert r.low <= r.value <= r.high and f.low <= f.value <= f.high
    assert f.high > f.low  # pieces differ in their false accepts
    with pytest.raises(ValueError, match="not swept"):
        at_threshold(c, 0.81)
