"""The split of stream mistakes by kind (training/stream_anatomy.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dlr_runtime.kws import KeywordSpotter, KWSConfig, softmax
from training.data.labels import SAMPLE_RATE
from training.data.vocab import SC12_LABELS
from training.stream_anatomy import anatomy, smoothed_posteriors, snr_band
from training.streams import Event, Stream

LABELS = list(SC12_LABELS)
FRAME_MS = 20.0
PER_S = 50  # frames per second


@pytest.mark.parametrize("k", [1, 4, 15])
def test_smoothed_posteriors_are_the_detectors_own(k: int) -> None:
    rng = np.random.default_rng(k)
    scores = rng.normal(0, 3, (60, len(LABELS)))
    spot = KeywordSpotter(LABELS, FRAME_MS, KWSConfig(smooth_ms=k * FRAME_MS))
    want = []
    for row in scores:
        spot.push_posterior(softmax(row))
        want.append(spot.sum / min(spot.frame, spot.k))
    np.testing.assert_allclose(smoothed_posteriors(scores, k), np.array(want), atol=1e-12)


def _set(logits: np.ndarray, label: str, t0: float, t1: float, p: float) -> None:
    """Frames t0..t1 s give `label` the posterior `p` (the 11 other labels share the rest)."""
    a, b = int(t0 * PER_S), int(t1 * PER_S)
    logits[a:b] = 0.0
    logits[a:b, LABELS.index(label)] = np.log(p * (len(LABELS) - 1) / (1 - p))


def _event(word: str, t0: float, voice: str = "espeak:v", snr_db: float = 15.0) -> Event:
    label = LABELS.index(word) if word in LABELS else LABELS.index("_unknown_")
    t = int(t0 * SAMPLE_RATE), int((t0 + 0.4) * SAMPLE_RATE)
    return Event(label, word, voice, *t, snr_db)


def test_every_mistake_is_put_on_its_kind() -> None:
    logits = np.zeros((18 * PER_S, len(LABELS)))
    logits[:, LABELS.index("_silence_")] = 8.0
    events = [
        _event("yes", 0.6),  # detected
        _event("no", 2.0, "flite:w"),  # peak 0.7: under the 0.8 threshold, above 0.7 of it
        _event("up", 4.0, "flite:w", -3.0),  # nothing at all
        _event("down", 6.0),  # "left" fires on it: confused, and a false accept
        _event("goat", 8.0),  # a near miss of "go", which fires
        _event("banana", 10.0),  # another word, "off" fires
        _event("yes", 12.0),  # detected, then fires again: a repeat
        _event("stop", 14.0, snr_db=float("nan")),  # peak 0.4: low (SNR not known)
    ]
    _set(logits, "yes", 1.0, 1.2, 0.99)
    _set(logits, "no", 2.4, 2.6, 0.7)
    _set(logits, "left", 6.5, 6.6, 0.99)
    _set(logits, "go", 8.5, 8.6, 0.99)
    _set(logits, "off", 10.5, 10.6, 0.99)
    _set(logits, "yes", 12.44, 12.6, 0.99)
    _set(logits, "yes", 13.4, 13.5, 0.99)
    _set(logits, "stop", 14.4, 14.6, 0.4)
    _set(logits, "right", 17.0, 17.1, 0.99)  # no word within 1.2 s
    stream = Stream(np.zeros(len(logits) * 320, np.float32), events)
    got = anatomy([(logits, stream)], LABELS, FRAME_MS, KWSConfig(threshold=0.8, smooth_ms=20.0))
    s = got.summary()
    assert s["commands"] == 6
    assert s["misses"] == {
        "confused": 1, "silent_unheard": 1, "silent_low": 1, "silent_near_threshold": 1
    }  # fmt: skip
    assert s["false_accepts"] == {
        "near_miss_word": 1, "other_word": 1, "other_command": 1, "repeat": 1, "no_word": 1
    }  # fmt: skip
    assert s["false_words"] == {"goat -> go": 1, "banana -> off": 1}
    assert s["commands_by_engine"] == {"espeak": 4, "flite": 2}
    assert s["misses_by_engine"] == {"espeak": 2, "flite": 2}
    assert s["commands_by_snr"] == {"< 0 dB": 1, "0-10 dB": 0, "10-20 dB": 4, ">= 20 dB": 0}
    assert s["misses_by_snr"] == {"< 0 dB": 1, "0-10 dB": 0, "10-20 dB": 2, ">= 20 dB": 0}
    assert s["hours"] == pytest.approx(18 / 3600)


def test_snr_bands() -> None:
    assert [snr_band(x) for x in (-0.1, 0.0, 9.9, 10.0, 25.0)] == [
        "< 0 dB", "0-10 dB", "0-10 dB", "10-20 dB", ">= 20 dB"
    ]  # fmt: skip
    assert snr_band(float("nan")) is None


def test_a_per_command_threshold_decides_how_near_a_miss_was() -> None:
    logits = np.zeros((4 * PER_S, len(LABELS)))
    logits[:, LABELS.index("_silence_")] = 8.0
    _set(logits, "no", 1.4, 1.6, 0.6)
    stream = Stream(np.zeros(len(logits) * 320, np.float32), [_event("no", 1.0)])
    for keywords, kind in (({}, "silent_low"), ({"no": 0.8}, "silent_near_threshold")):
        cfg = KWSConfig(threshold=0.99, keywords=keywords, smooth_ms=20.0)
        got = anatomy([(logits, stream)], LABELS, FRAME_MS, cfg).summary()
        assert got["misses"][kind] == 1, keywords


def test_stream_words_carry_their_signal_to_noise_ratio() -> None:
    from training.data.sc12 import WordPool
    from training.streams import build_stream

    t = np.arange(8000) / SAMPLE_RATE
    clips = [(np.sin(2 * np.pi * f * t) * 8000).astype(np.int16) for f in (300, 500, 700, 900)]
    words = np.array(["yes", "no", "cat", "dog"])
    labels = np.array([LABELS.index("yes"), LABELS.index("no"), 11, 11], np.int64)
    pool = WordPool(
        clips, labels, words, np.array(["espeak:v"] * 4), np.array(["espeak"] * 4),
        np.array(["v"] * 4), np.zeros(4, bool),
    )  # fmt: skip
    a, b = (build_stream(pool, 1.0, [], seed=3) for _ in range(2))
    assert a.events == b.events and np.array_equal(a.audio, b.audio)  # deterministic
    snr = np.array([e.snr_db for e in a.events])
    assert len(snr) > 5 and np.isfinite(snr).all()
    # the background is 5-30 dB under the mean speech level and a word is 0-12 dB under it
    assert snr.min() > -12.0 and snr.max() < 35.0 and snr.std() > 2.0
