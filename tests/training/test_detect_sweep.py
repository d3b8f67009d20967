"""The sweep's decision rule (training/detect_sweep.py) against the reference, frame by frame
(dlr_runtime.kws.KeywordSpotter): the same detections at every operating point."""

from __future__ import annotations

import numpy as np
import pytest

from dlr_runtime.kws import KeywordSpotter, KWSConfig
from training.data.vocab import SC12_LABELS
from training.detect_sweep import fire, smoothed

LABELS = list(SC12_LABELS)
FRAME_MS = 20.0


def stream_scores(seed: int, frames: int = 4000, gated: bool = True) -> np.ndarray:
    """Logits shaped like a stream's: mostly silence or unknown, commands in bursts whose
    posteriors rise and fall, near-ties between two commands, and gated (quiet) stretches."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1.0, (frames, len(LABELS)))
    x[:, LABELS.index("_silence_")] += 3.0
    t = 0
    while t < frames:
        t += int(rng.integers(5, 80))
        n = int(rng.integers(3, 40))
        c = rng.integers(0, 10, size=2)
        bump = np.sin(np.linspace(0, np.pi, n)) * rng.uniform(2.0, 9.0)
        x[t : t + n, c[0]] += bump[: len(x[t : t + n])]
        if rng.random() < 0.3:  # a rival command close behind
            x[t : t + n, c[1]] += 0.9 * bump[: len(x[t : t + n])]
        t += n
    if gated:  # frames a voice-activity gate skipped: silence for certain
        for s in rng.integers(0, frames - 50, size=8):
            x[s : s + int(rng.integers(5, 50))] = -np.inf
            x[s : s + 1, LABELS.index("_silence_")] = 0.0
        quiet = np.isneginf(x).all(1)
        x[quiet, LABELS.index("_silence_")] = 0.0
    return x


CONFIGS = [
    KWSConfig(threshold=t, smooth_ms=s, refractory_ms=r, rearm=a)
    for t in (0.3, 0.5, 0.8, 0.93, 0.99)
    for s in (20.0, 100.0, 300.0)
    for r, a in ((800.0, 0.5), (0.0, 0.5), (200.0, 1.0), (800.0, 0.0))
]


@pytest.mark.parametrize("seed", range(3))
def test_every_operating_point_detects_what_the_reference_detects(seed):
    scores = stream_scores(seed)
    cache = {}
    total = 0
    for cfg in CONFIGS:
        if cfg.smooth_ms not in cache:
            cache[cfg.smooth_ms] = smoothed(scores, LABELS, FRAME_MS, cfg)
        want = KeywordSpotter(LABELS, FRAME_MS, cfg).run(scores)
        assert fire(cache[cfg.smooth_ms], LABELS, cfg) == want, cfg
        total += len(want)
    assert total > 500  # the streams fire, at every kind of point


def test_per_command_thresholds_and_a_listened_subset():
    scores = stream_scores(7)
    for cfg in (
        KWSConfig(threshold=0.6, keywords={"yes": 0.95, "down": 0.4}, smooth_ms=100.0),
        KWSConfig(threshold=0.5, listen=["go", "stop", "no"], smooth_ms=200.0),
    ):
        want = KeywordSpotter(LABELS, FRAME_MS, cfg).run(scores)
        assert want and fire(smoothed(scores, LABELS, FRAME_MS, cfg), LABELS, cfg) == want


def test_the_smoothing_is_the_reference_values_bit_for_bit():
    scores = stream_scores(3, frames=600)
    cfg = KWSConfig(smooth_ms=100.0)
    spot = KeywordSpotter(LABELS, FRAME_MS, cfg)
    sm = smoothed(scores, LABELS, FRAME_MS, cfg)
    for t, row in enumerate(scores):
        spot.push(row)
        n = min(t + 1, spot.k)
        assert np.array_equal(sm.values[t], spot.sum[spot.cmd_idx] / n)


def test_a_config_of_another_window_or_commands_is_refused():
    sm = smoothed(stream_scores(0, frames=100), LABELS, FRAME_MS, KWSConfig(smooth_ms=100.0))
    with pytest.raises(ValueError, match="another window"):
        fire(sm, LABELS, KWSConfig(smooth_ms=300.0))
    with pytest.raises(ValueError, match="other commands"):
        fire(sm, LABELS, KWSConfig(smooth_ms=100.0, listen=["yes"]))


def test_the_evaluation_sweep_scores_as_the_reference_rule():
    from dataclasses import asdict

    from training.data.labels import SAMPLE_RATE
    from training.eval_speech import THRESHOLDS, sweep
    from training.streams import Event, Stream, score

    rng = np.random.default_rng(11)
    per_stream = []
    for seed in (21, 22):
        x = stream_scores(seed, frames=3000)
        frame = int(SAMPLE_RATE * FRAME_MS / 1000)
        events = []
        for start in range(40, 2900, 60):  # words every 1.2 s, commands among them
            label = int(rng.integers(0, len(LABELS)))
            events.append(Event(label, "w", "v", start * frame, (start + 30) * frame))
        per_stream.append((x, Stream(np.zeros(3000 * frame, np.float32), events)))
    base = KWSConfig(smooth_ms=200.0)
    got = sweep(per_stream, LABELS, FRAME_MS, base)
    for t, s in zip(THRESHOLDS, got, strict=True):
        cfg = KWSConfig(**{**asdict(base), "threshold": t, "keywords": {}})
        assert s == score(per_stream, LABELS, FRAME_MS, cfg)
    assert sum(s.detected for s in got) > 0 and sum(s.false_accepts for s in got) > 0
