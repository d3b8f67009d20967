"""The keyword-spotting decision rule (dlr_runtime.kws) on hand-made score sequences."""

from __future__ import annotations

import numpy as np
import pytest

from dlr_runtime.kws import KeywordSpotter, KWSConfig, detect, softmax

LABELS = ["yes", "no", "stop", "_silence_", "_unknown_"]
FRAME_MS = 20.0


def scores_for(seq: list[tuple[str, int]], strength: float = 8.0) -> np.ndarray:
    """Logit rows: `n` frames where `label` dominates, for each (label, n)."""
    rows = []
    for label, n in seq:
        row = np.zeros(len(LABELS))
        row[LABELS.index(label)] = strength
        rows += [row] * n
    return np.array(rows)


def test_one_detection_per_word_with_times():
    s = scores_for(
        [("_silence_", 50), ("yes", 20), ("_silence_", 60), ("stop", 15), ("_silence_", 30)]
    )
    dets = detect(s, LABELS, FRAME_MS, KWSConfig(threshold=0.9, smooth_ms=60))
    assert [d.label for d in dets] == ["yes", "stop"]
    yes, stop = dets
    assert 50 * FRAME_MS < yes.end_ms <= 55 * FRAME_MS  # fires within 3 frames of the onset
    assert yes.start_ms <= yes.end_ms and yes.score >= 0.9
    assert stop.frame > yes.frame + 60


def test_refractory_and_rearm():
    s = scores_for([("yes", 10), ("_silence_", 5), ("yes", 10), ("_silence_", 40), ("yes", 10)])
    long = detect(s, LABELS, FRAME_MS, KWSConfig(threshold=0.9, smooth_ms=0, refractory_ms=600))
    assert len(long) == 2  # the second "yes" 15 frames (300 ms) later is inside the refractory
    short = detect(s, LABELS, FRAME_MS, KWSConfig(threshold=0.9, smooth_ms=0, refractory_ms=100))
    assert len(short) == 3
    held = scores_for([("yes", 200)])  # one long word: never re-armed, fires once
    assert len(detect(held, LABELS, FRAME_MS, KWSConfig(threshold=0.9, refractory_ms=0))) == 1


def test_thresholds_keywords_and_listen():
    s = scores_for([("yes", 10), ("_silence_", 60), ("no", 10), ("_silence_", 60)], strength=2.0)
    p = softmax(s[0])[0]  # posterior of a dominant label at strength 2
    assert len(detect(s, LABELS, FRAME_MS, KWSConfig(threshold=p + 0.01))) == 0
    assert len(detect(s, LABELS, FRAME_MS, KWSConfig(threshold=p - 0.01))) == 2
    only_no = KWSConfig(threshold=0.99, keywords={"no": p - 0.01})
    assert [d.label for d in detect(s, LABELS, FRAME_MS, only_no)] == ["no"]
    listen = KWSConfig(threshold=p - 0.01, listen=["yes"])
    assert [d.label for d in detect(s, LABELS, FRAME_MS, listen)] == ["yes"]


def test_silence_and_unknown_never_fire():
    s = scores_for([("_unknown_", 100), ("_silence_", 100)], strength=20.0)
    assert detect(s, LABELS, FRAME_MS, KWSConfig(threshold=0.3)) == []


@pytest.mark.parametrize(
    "cfg,match",
    [
        (KWSConfig(keywords={"maybe": 0.5}), "unknown keyword"),
        (KWSConfig(listen=["_silence_"]), "unknown keyword"),
        (KWSConfig(threshold=0.0), "threshold"),
        (KWSConfig(keywords={"yes": 1.5}), "threshold"),
        (KWSConfig(refractory_ms=-1), "refractory"),
    ],
)
def test_bad_options_are_refused(cfg, match):
    with pytest.raises(ValueError, match=match):
        KeywordSpotter(LABELS, FRAME_MS, cfg)


def test_snapshot_restore_continues_exactly():
    rng = np.random.default_rng(0)
    s = rng.normal(0, 3, (400, len(LABELS)))
    cfg = KWSConfig(threshold=0.6, smooth_ms=80)
    whole = detect(s, LABELS, FRAME_MS, cfg)
    assert whole  # the random scores do fire
    a = KeywordSpotter(LABELS, FRAME_MS, cfg)
    first = a.run(s[:173])
    b = KeywordSpotter(LABELS, FRAME_MS, cfg)
    b.restore(a.snapshot())
    assert first + b.run(s[173:]) == whole


def test_metadata_round_trip():
    cfg = KWSConfig(threshold=0.85, keywords={"stop": 0.7}, refractory_ms=500)
    back = KWSConfig.from_metadata({"detection": cfg.to_dict()})
    assert back == cfg
    assert KWSConfig.from_metadata({}) == KWSConfig()
