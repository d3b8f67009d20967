"""What a keyword spotter's mistakes in continuous streams are made of.

Recall and false accepts per hour (``streams.score``) say how many mistakes the decision rule
makes; this module says which ones, so the next change aims at the larger share:

- every **false accept** is put on the word it fired on (the last word that started before it
  and ended at most ``max_delay_s`` earlier, the window ``streams.match`` gives a command):
  an unknown near miss of a command (``vocab.NEAR_MISSES``), another unknown word, a command
  taken for another command, a second detection of one command, or no word at all (noise);
- every **missed command** is either *confused* (another command fired on it) or *silent*
  (nothing fired), and the silent ones are split by the highest smoothed posterior its own
  label reached while it was spoken or up to ``max_delay_s`` after: below 0.3 (the model did
  not hear it), 0.3 up to 0.7 of the threshold, or from 0.7 of the threshold up to it (a
  near miss of the threshold: the operating point, not the model, rejected it);
- misses per engine of the voice that spoke the command, and per band of the command's
  signal-to-noise ratio in the stream (``Event.snr_db``).

The smoothed posteriors are the decision rule's own (``dlr_runtime.kws.KeywordSpotter``: the
mean of the last ``smooth_ms`` of softmax outputs, fewer at the start of a stream).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from dlr_runtime.kws import KeywordSpotter, KWSConfig, softmax
from training.data.labels import SAMPLE_RATE
from training.data.sc12 import SIL, UNK
from training.data.vocab import NEAR_MISSES
from training.streams import Event, Stream, match

FALSE_KINDS = ("near_miss_word", "other_word", "other_command", "repeat", "no_word")
MISS_KINDS = ("confused", "silent_unheard", "silent_low", "silent_near_threshold")
SNR_BANDS = ("< 0 dB", "0-10 dB", "10-20 dB", ">= 20 dB")


def snr_band(snr_db: float) -> str | None:
    """The SNR_BANDS entry of a word's signal-to-noise ratio (None when not known)."""
    if np.isnan(snr_db):
        return None
    return SNR_BANDS[int(np.searchsorted([0.0, 10.0, 20.0], snr_db, side="right"))]


@dataclass
class Anatomy:
    """Mistakes of one operating point over a set of streams, by kind."""

    hours: float = 0.0
    commands: int = 0
    false_accepts: Counter[str] = field(default_factory=Counter)  # FALSE_KINDS
    false_words: Counter[str] = field(default_factory=Counter)  # "word -> label" on unknowns
    misses: Counter[str] = field(default_factory=Counter)  # MISS_KINDS
    commands_by_engine: Counter[str] = field(default_factory=Counter)
    misses_by_engine: Counter[str] = field(default_factory=Counter)
    commands_by_snr: Counter[str] = field(default_factory=Counter)  # SNR_BANDS
    misses_by_snr: Counter[str] = field(default_factory=Counter)

    def summary(self, top: int = 10) -> dict:
        """Plain values for eval.json: counts per kind, the most frequent false-accept words."""
        d = asdict(self)
        d["false_accepts"] = {k: self.false_accepts[k] for k in FALSE_KINDS}
        d["misses"] = {k: self.misses[k] for k in MISS_KINDS}
        d["false_words"] = dict(self.false_words.most_common(top))
        d["commands_by_engine"] = dict(sorted(self.commands_by_engine.items()))
        d["misses_by_engine"] = {e: self.misses_by_engine[e] for e in d["commands_by_engine"]}
        d["commands_by_snr"] = {b: self.commands_by_snr[b] for b in SNR_BANDS}
        d["misses_by_snr"] = {b: self.misses_by_snr[b] for b in SNR_BANDS}
        return d


def smoothed_posteriors(scores: np.ndarray, k: int) -> np.ndarray:
    """(T, C) logits -> (T, C) mean of the last ``k`` softmax rows (fewer at the start), the
    value ``KeywordSpotter`` compares with its thresholds."""
    p = softmax(scores)
    c = np.concatenate([np.zeros((1, p.shape[1])), np.cumsum(p, axis=0)])
    n = np.arange(1, len(p) + 1)
    lo = np.maximum(0, n - k)
    return (c[n] - c[lo]) / (n - lo)[:, None]


def _frames(start: int, end: int, frame_ms: float) -> slice:
    """Frames whose end lies in [start, end] samples (the window ``match`` accepts)."""
    per = frame_ms / 1000 * SAMPLE_RATE
    return slice(max(0, int(np.ceil(start / per)) - 1), int(end // per))


def anatomy(
    per_stream: list[tuple[np.ndarray, Stream]],
    labels: list[str],
    frame_ms: float,
    config: KWSConfig,
    max_delay_s: float = 1.2,
) -> Anatomy:
    """The mistakes of the decision rule at `config` over every (scores (T, C), stream)."""
    spot = KeywordSpotter(labels, frame_ms, config)
    thresholds = dict(zip((labels[int(i)] for i in spot.cmd_idx), spot.thresholds, strict=True))
    delay = int(max_delay_s * SAMPLE_RATE)
    out = Anatomy()
    for scores, stream in per_stream:
        out.hours += stream.hours
        spot.reset()  # (one detector, a fresh state per stream)
        dets = spot.run(scores)
        m = match(dets, stream.events, labels, max_delay_s)
        hit = {id(e) for e in m.hits}
        smooth = smoothed_posteriors(scores, spot.k)
        times = [d.end_ms / 1000 * SAMPLE_RATE for d in dets]
        for e in stream.events:
            if e.label >= SIL:
                continue
            eng, band = e.voice.split(":")[0], snr_band(e.snr_db)
            out.commands += 1
            out.commands_by_engine[eng] += 1
            if band is not None:
                out.commands_by_snr[band] += 1
            if id(e) in hit:
                continue
            out.misses_by_engine[eng] += 1
            if band is not None:
                out.misses_by_snr[band] += 1
            if any(e.start <= t <= e.end + delay for t in times):
                out.misses["confused"] += 1
                continue
            window = smooth[_frames(e.start, e.end + delay, frame_ms), e.label]
            peak = float(window.max()) if window.size else 0.0
            th = thresholds.get(labels[e.label], config.threshold)
            kind = "unheard" if peak < 0.3 else "low" if peak < 0.7 * th else "near_threshold"
            out.misses[f"silent_{kind}"] += 1
        for d in m.false:
            t = d.end_ms / 1000 * SAMPLE_RATE
            kind, word = _false_kind(t, d.label, stream.events, labels, delay)
            out.false_accepts[kind] += 1
            if word is not None:
                out.false_words[f"{word} -> {d.label}"] += 1
    return out


def word_at(t: float, events: list[Event], delay: int) -> Event | None:
    """The word a detection at sample `t` fired on: the last one that started before `t` and
    ended at most `delay` samples earlier (the window ``match`` gives a command), or None."""
    on = [e for e in events if e.start <= t <= e.end + delay]
    return on[-1] if on else None


def _false_kind(
    t: float, label: str, events: list[Event], labels: list[str], delay: int
) -> tuple[str, str | None]:
    """The kind of a false accept of `label` at sample `t` and, on an unknown word, the word."""
    e = word_at(t, events, delay)
    if e is None:
        return "no_word", None
    if e.label == UNK:
        return ("near_miss_word" if e.word in NEAR_MISSES else "other_word"), e.word
    return ("repeat" if labels[e.label] == label else "other_command"), None
