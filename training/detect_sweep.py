"""The decision rule at many thresholds from one pass over a stream (the evaluation's sweeps).

``dlr_runtime.kws.KeywordSpotter`` is the reference: one frame at a time, as the server runs
it. A sweep over thresholds ran it once per threshold, and the posteriors and their running
mean, which do not depend on the threshold, were recomputed each time: on five hours of
streams a sweep of 26 thresholds took minutes. Here:

1. :func:`smoothed` computes each command's smoothed posterior for every frame once, by the
   reference's own recurrence (softmax per row, the same ring buffer and running sum), so the
   values are the same floating-point numbers the reference compares;
2. :func:`fire` replays the firing logic for one operating point visiting only the frames
   where some command reaches its threshold. Whether a command is armed at such a frame and
   when its rise began follow from the frames where its smoothed posterior was under
   ``rearm x threshold`` (a sorted array per command, searched), which is all the reference's
   per-frame bookkeeping records.

The detections equal the reference's, label, score, start, end and frame
(``tests/training/test_detect_sweep.py`` checks it on random and real-shaped scores).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlr_runtime.kws import Detection, KeywordSpotter, KWSConfig, softmax


@dataclass(frozen=True)
class Smoothed:
    """Each listened command's smoothed posterior per frame, and how to read it."""

    values: np.ndarray  # (T, K) float64
    commands: list[str]  # (K,) the labels of the columns
    frame_ms: float
    k: int  # frames in the smoothing window


def smoothed(scores: np.ndarray, labels: list[str], frame_ms: float, config: KWSConfig) -> Smoothed:
    """The reference's smoothed posteriors (T, K) of (T, C) scores, for `config`'s listened
    commands and smoothing window (its thresholds play no part)."""
    spot = KeywordSpotter(labels, frame_ms, config)
    post = softmax(np.asarray(scores))  # (T, C), row by row as the reference's push
    ring, total = np.zeros_like(spot.ring), np.zeros_like(spot.sum)
    out = np.empty((len(post), len(spot.cmd_idx)))
    k, idx = spot.k, spot.cmd_idx
    for t, p in enumerate(post):
        slot = t % k
        total += p - ring[slot]
        ring[slot] = p
        out[t] = total[idx] / min(t + 1, k)
    return Smoothed(out, [labels[i] for i in idx], float(frame_ms), k)


def fire(sm: Smoothed, labels: list[str], config: KWSConfig) -> list[Detection]:
    """The reference's detections at `config` (same commands and smoothing as `sm` was
    computed with; any thresholds, re-arm level and refractory period)."""
    spot = KeywordSpotter(labels, sm.frame_ms, config)
    if [labels[i] for i in spot.cmd_idx] != sm.commands or spot.k != sm.k:
        raise ValueError("config listens to other commands or smooths over another window")
    thr = spot.thresholds  # (K,)
    vals = sm.values
    low = vals < config.rearm * thr  # (T, K): frames that re-arm a command (and restart its rise)
    lows = [np.flatnonzero(low[:, j]) for j in range(vals.shape[1])]
    hot_rows = np.flatnonzero((vals >= thr).any(axis=1))
    fired = np.full(vals.shape[1], -1, np.int64)  # frame each command last fired (-1: never)
    last_fire = -(10**9)
    out = []
    for t in hot_rows:
        t = int(t)
        if t - last_fire < spot.refractory:
            continue
        row = vals[t]
        hot = row >= thr
        for j in np.flatnonzero(hot):
            if fired[j] >= 0:  # armed again only by a low frame after it fired, up to now
                i = np.searchsorted(lows[j], fired[j], side="right")
                hot[j] = i < len(lows[j]) and lows[j][i] <= t
        if not hot.any():
            continue
        j = int(np.argmax(np.where(hot, row, -1.0)))
        fired[j], last_fire = t, t
        i = np.searchsorted(lows[j], t, side="right") - 1  # its last low frame up to now
        rise = int(lows[j][i]) + 1 if i >= 0 else 0
        out.append(
            Detection(
                label=sm.commands[j],
                score=float(row[j]),
                start_ms=float(rise * sm.frame_ms),
                end_ms=float((t + 1) * sm.frame_ms),
                frame=t,
            )
        )
    return out
