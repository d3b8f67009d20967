"""Operating points chosen on valid streams: the shared-threshold rule and the per-command
rule (an exact optimum over the false-accept budget, checked by brute force)."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from dlr_runtime.kws import KWSConfig
from training.operating_point import choose_point, global_point, per_command_thresholds
from training.streams import StreamScore

THRESHOLDS = (0.5, 0.7, 0.9)


def point(t: float, hits: dict[str, int], false: dict[str, int], hours: float = 1.0) -> StreamScore:
    s = StreamScore(t, 30, sum(hits.values()), sum(false.values()), hours, [])
    s.detected_by_label, s.false_by_label = Counter(hits), Counter(false)
    return s


def sweep_of(table: dict[str, list[tuple[int, int]]]) -> list[StreamScore]:
    """{command: [(hits, false) per threshold in THRESHOLDS]} -> a sweep."""
    return [
        point(t, {c: v[i][0] for c, v in table.items()}, {c: v[i][1] for c, v in table.items()})
        for i, t in enumerate(THRESHOLDS)
    ]


def test_global_point_is_the_lowest_threshold_within_the_target():
    sw = sweep_of({"yes": [(9, 6), (7, 2), (3, 0)]})
    assert global_point(sw, 2.0).threshold == 0.7
    assert global_point(sw, 0.0).threshold == 0.9
    assert global_point(sw, 100.0).threshold == 0.5
    sw = sweep_of({"yes": [(9, 6), (7, 5), (3, 4)]})  # nothing within: the highest threshold
    assert global_point(sw, 1.0).threshold == 0.9


def test_a_command_without_false_accepts_gets_the_lowest_threshold():
    # "go" fires on other words, "yes" never does: yes goes low, go stays high
    sw = sweep_of({"yes": [(10, 0), (8, 0), (5, 0)], "go": [(10, 9), (8, 4), (6, 0)]})
    assert per_command_thresholds(sw, ["yes", "go"], budget=0) == {"yes": 0.5, "go": 0.9}
    assert per_command_thresholds(sw, ["yes", "go"], budget=4) == {"yes": 0.5, "go": 0.7}
    # ties keep the higher threshold (fewer false accepts elsewhere, same recall)
    sw = sweep_of({"yes": [(5, 0), (5, 0), (5, 0)]})
    assert per_command_thresholds(sw, ["yes"], budget=3) == {"yes": 0.9}


def test_when_no_choice_fits_every_command_takes_its_highest_threshold():
    sw = sweep_of({"yes": [(5, 3), (4, 2), (3, 1)], "no": [(5, 1), (4, 1), (3, 1)]})
    assert per_command_thresholds(sw, ["yes", "no"], budget=1) == {"yes": 0.9, "no": 0.9}


@pytest.mark.parametrize("seed", range(20))
def test_per_command_choice_is_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    cmds = ["a", "b", "c"]
    table = {}
    for c in cmds:  # hits and false accepts fall as the threshold rises
        hits = np.sort(rng.integers(0, 12, len(THRESHOLDS)))[::-1]
        false = np.sort(rng.integers(0, 6, len(THRESHOLDS)))[::-1]
        table[c] = list(zip(hits.tolist(), false.tolist(), strict=True))
    sw = sweep_of(table)
    budget = int(rng.integers(0, 10))
    got = per_command_thresholds(sw, cmds, budget)
    col = {t: i for i, t in enumerate(THRESHOLDS)}

    def value(choice: dict[str, float]) -> tuple[int, int]:
        return (
            sum(table[c][col[choice[c]]][0] for c in cmds),
            sum(table[c][col[choice[c]]][1] for c in cmds),
        )

    feasible = [
        dict(zip(cmds, ts, strict=True))
        for ts in itertools.product(THRESHOLDS, repeat=len(cmds))
        if value(dict(zip(cmds, ts, strict=True)))[1] <= budget
    ]
    if not feasible:
        assert got == {c: 0.9 for c in cmds}
        return
    best = max(value(f)[0] for f in feasible)
    assert value(got)[1] <= budget
    assert value(got)[0] == best
    assert value(got)[1] == min(value(f)[1] for f in feasible if value(f)[0] == best)


def test_choose_point_checks_the_joint_rule_and_shrinks_the_budget():
    sw = sweep_of({"yes": [(10, 0), (8, 0), (5, 0)], "go": [(10, 2), (8, 1), (6, 0)]})
    base = KWSConfig(threshold=0.5, smooth_ms=60.0)
    calls: list[dict[str, float]] = []

    def scorer(cfg: KWSConfig) -> StreamScore:  # the joint rule finds one more false accept
        calls.append(dict(cfg.keywords))
        fa = sum(sw[THRESHOLDS.index(t)].false_by_label[c] for c, t in cfg.keywords.items())
        hits = sum(sw[THRESHOLDS.index(t)].detected_by_label[c] for c, t in cfg.keywords.items())
        return point(0.0, {"all": hits}, {"all": fa + 1})

    got = choose_point(sw, base, ["yes", "go"], 1.0, scorer, per_command=True)
    assert got.rule == "per_command" and got.budget == 0
    assert got.config.keywords == {"yes": 0.5, "go": 0.9}
    assert got.config.smooth_ms == 60.0  # the rest of the base point is kept
    assert got.config.threshold == global_point(sw, 1.0).threshold == 0.7
    assert calls == [{"yes": 0.5, "go": 0.7}, {"yes": 0.5, "go": 0.9}]
    # off: the shared threshold, and the scorer is not needed
    calls.clear()
    glob = choose_point(sw, base, ["yes", "go"], 2.0, scorer, per_command=False)
    assert glob.rule == "global" and glob.config.keywords == {} and glob.config.threshold == 0.5
    assert calls == []


def test_choose_point_keeps_the_shared_threshold_when_it_detects_more():
    sw = sweep_of({"yes": [(10, 0), (8, 0), (5, 0)]})

    def worse(cfg: KWSConfig) -> StreamScore:  # jointly, the per-command point loses commands
        return point(0.0, {"yes": 1}, {})

    got = choose_point(sw, KWSConfig(), ["yes"], 1.0, worse, per_command=True)
    assert got.rule == "global" and got.config.threshold == 0.5


def test_stream_score_counts_hits_and_false_accepts_per_label():
    from training.data.labels import SAMPLE_RATE
    from training.data.vocab import SC12_LABELS
    from training.streams import Event, Stream, score

    labels = list(SC12_LABELS)
    yes, go, unk = labels.index("yes"), labels.index("go"), labels.index("_unknown_")
    frames = 250  # 20 ms frames: 5 s
    logits = np.zeros((frames, len(labels)))
    logits[:, labels.index("_silence_")] = 8.0
    logits[50:60, yes] = 20.0  # fires right after "yes" ends (1.0 s)
    logits[150:160, go] = 20.0  # fires on the unknown word at 3 s: a false accept of "go"
    events = [
        Event(yes, "yes", "v", int(0.6 * SAMPLE_RATE), int(1.0 * SAMPLE_RATE)),
        Event(unk, "goat", "v", int(2.6 * SAMPLE_RATE), int(3.0 * SAMPLE_RATE)),
        Event(labels.index("no"), "no", "v", int(4.0 * SAMPLE_RATE), int(4.3 * SAMPLE_RATE)),
    ]
    stream = Stream(np.zeros(frames * 320, np.float32), events)
    got = score([(logits, stream)], labels, 20.0, KWSConfig(threshold=0.5, smooth_ms=20.0))
    assert (got.commands, got.detected, got.false_accepts) == (2, 1, 1)
    assert got.commands_by_label == Counter({"yes": 1, "no": 1})
    assert got.detected_by_label == Counter({"yes": 1})
    assert got.false_by_label == Counter({"go": 1})
    assert got.delays_s == [pytest.approx(0.02)]


def test_a_detection_counts_while_the_command_is_spoken_but_not_before_it():
    from training.data.labels import SAMPLE_RATE
    from training.streams import Event, match

    labels = ["yes", "no", "_silence_", "_unknown_"]
    word = Event(0, "yes", "v", int(1.0 * SAMPLE_RATE), int(1.6 * SAMPLE_RATE))

    def det(t_s: float):
        from dlr_runtime.kws import Detection

        return Detection("yes", 0.9, t_s * 1000 - 100, t_s * 1000, int(t_s * 50))

    for t, hit in [(0.9, False), (1.1, True), (1.55, True), (2.7, True), (2.9, False)]:
        m = match([det(t)], [word], labels)
        assert (len(m.hits), len(m.false)) == ((1, 0) if hit else (0, 1)), t
    m = match([det(1.3), det(1.7)], [word], labels)  # one word fires once: the second is false
    assert len(m.hits) == 1 and len(m.false) == 1 and m.delays_s == [pytest.approx(-0.3)]
