"""How sure a stream figure is: a bootstrap over the pieces of the evaluation streams.

``dlr-eval speech`` builds its streams in independent pieces (5 minutes each by default, each
from its own seed: its own words, voices, gaps, background and channel) and picks the recall
at a false-accept target where the count of false accepts crosses the target
(``operating_point.global_point``). In one hour, 10 FA/h is ten events; one false accept more or
less moves the threshold a step, and a step near the top of the sweep moves the recall by
several points. This module puts error bars on that figure:

- :func:`piece_counts` keeps, per piece and per threshold, the commands, the commands
  detected, the false accepts and the hours (the sufficient statistics of the figure);
- :func:`recall_at_targets` computes the figure from weighted pieces, vectorised over
  resamples (weights (B, P): how often each piece is drawn);
- :func:`compare` resamples whole pieces with replacement (the percentile bootstrap). Models
  scored on the *same* streams share each resample, so the spread of their difference is the
  paired one, much narrower than either model's own spread when they fail on the same words.

A piece is the unit because its events are not independent of one another (one background,
one channel, and the refractory period link neighbouring words); pieces are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from training.streams import StreamScore


@dataclass(frozen=True)
class PieceCounts:
    """Per-piece counts of one model's threshold sweep (thresholds ascending)."""

    thresholds: np.ndarray  # (K,)
    commands: np.ndarray  # (P,) commands spoken in each piece
    detected: np.ndarray  # (P, K) commands detected at each threshold
    false_accepts: np.ndarray  # (P, K)
    hours: np.ndarray  # (P,)

    @property
    def pieces(self) -> int:
        return len(self.commands)


def piece_counts(sweeps: Sequence[Sequence[StreamScore]]) -> PieceCounts:
    """`sweeps[p][k]`: piece p scored at threshold k (the same ascending thresholds for every
    piece, e.g. ``eval_speech.sweep`` of that piece alone)."""
    if not sweeps:
        raise ValueError("no pieces")
    th = np.array([s.threshold for s in sweeps[0]], np.float64)
    if np.any(np.diff(th) <= 0):
        raise ValueError("thresholds must be strictly ascending")
    for p, sw in enumerate(sweeps):
        if not np.array_equal([s.threshold for s in sw], th):
            raise ValueError(f"piece {p} is swept over other thresholds")
        if len({s.commands for s in sw}) != 1 or len({s.hours for s in sw}) != 1:
            raise ValueError(f"piece {p}: commands or hours differ between thresholds")
    return PieceCounts(
        thresholds=th,
        commands=np.array([sw[0].commands for sw in sweeps], np.float64),
        detected=np.array([[s.detected for s in sw] for sw in sweeps], np.float64),
        false_accepts=np.array([[s.false_accepts for s in sw] for sw in sweeps], np.float64),
        hours=np.array([sw[0].hours for sw in sweeps], np.float64),
    )


def recall_at_targets(
    c: PieceCounts, targets: Sequence[float], weights: np.ndarray | None = None
) -> np.ndarray:
    """Recall at the lowest threshold with at most `target` false accepts per hour, per target
    (the highest threshold where none is: ``operating_point.global_point``'s rule) -> (B, T),
    for pieces weighted by `weights` (B, P); unit weights when None (B = 1)."""
    w = np.ones((1, c.pieces)) if weights is None else np.atleast_2d(weights).astype(np.float64)
    det = w @ c.detected  # (B, K)
    fa = w @ c.false_accepts  # (B, K)
    hours = np.maximum(w @ c.hours, 1e-12)[:, None]  # (B, 1)
    cmds = np.maximum(w @ c.commands, 1.0)[:, None]
    recall = det / cmds  # (B, K)
    k_last = len(c.thresholds) - 1
    out = np.empty((w.shape[0], len(targets)))
    rows = np.arange(w.shape[0])
    for j, target in enumerate(targets):
        ok = fa / hours <= target + 1e-9  # (B, K)
        first = np.where(ok.any(1), ok.argmax(1), k_last)
        out[:, j] = recall[rows, first]
    return out


def at_threshold(
    c: PieceCounts, threshold: float, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Recall and false accepts per hour at one swept threshold (a fixed operating point)
    -> two (B,) arrays, for pieces weighted by `weights` (B, P); unit weights when None."""
    hit = np.flatnonzero(np.isclose(c.thresholds, threshold))
    if hit.size != 1:
        raise ValueError(f"threshold {threshold} was not swept ({c.thresholds.tolist()})")
    k = int(hit[0])
    w = np.ones((1, c.pieces)) if weights is None else np.atleast_2d(weights).astype(np.float64)
    recall = (w @ c.detected[:, k]) / np.maximum(w @ c.commands, 1.0)
    return recall, (w @ c.false_accepts[:, k]) / np.maximum(w @ c.hours, 1e-12)


def point_intervals(
    c: PieceCounts, threshold: float, resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[Interval, Interval]:
    """Recall and false accepts per hour at `threshold`, each with its bootstrap interval."""
    r0, f0 = at_threshold(c, threshold)
    r, f = at_threshold(c, threshold, resample_weights(c.pieces, resamples, seed))
    return _interval(r0[0], r, level), _interval(f0[0], f, level)


@dataclass(frozen=True)
class Interval:
    value: float  # on the streams as they are (no resampling)
    low: float  # percentile bootstrap interval
    high: float

    def fmt(self, scale: float = 100.0, signed: bool = False) -> str:
        s = "+" if signed else ""
        return (
            f"{scale * self.value:{s}.1f} [{scale * self.low:{s}.1f}, {scale * self.high:{s}.1f}]"
        )


@dataclass(frozen=True)
class Comparison:
    """Each model's recall at each target, and each model's difference from the first."""

    names: list[str]
    targets: list[float]
    level: float  # e.g. 0.95
    resamples: int
    pieces: int
    recall: dict[str, list[Interval]]  # per model, per target
    mean_recall: dict[str, Interval]  # per model, the mean over the targets
    diff: dict[str, list[Interval]]  # per model but the first: model - first, per target
    mean_diff: dict[str, Interval]
    p_better: dict[str, float]  # share of resamples where the model's mean beats the first's

    def to_dict(self) -> dict:
        def iv(x: Interval) -> dict[str, float]:
            return {"value": x.value, "low": x.low, "high": x.high}

        return {
            "targets": self.targets,
            "level": self.level,
            "resamples": self.resamples,
            "pieces": self.pieces,
            "models": {
                n: {
                    "recall": [iv(x) for x in self.recall[n]],
                    "mean_recall": iv(self.mean_recall[n]),
                    **(
                        {
                            "diff_from_first": [iv(x) for x in self.diff[n]],
                            "mean_diff_from_first": iv(self.mean_diff[n]),
                            "p_better_than_first": self.p_better[n],
                        }
                        if n in self.diff
                        else {}
                    ),
                }
                for n in self.names
            },
        }


def resample_weights(pieces: int, resamples: int, seed: int) -> np.ndarray:
    """(B, P) draw counts: each row draws `pieces` pieces with replacement."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(pieces, np.full(pieces, 1.0 / pieces), size=resamples).astype(float)


def _interval(point: float, draws: np.ndarray, level: float) -> Interval:
    a = (1 - level) / 2
    lo, hi = np.quantile(draws, [a, 1 - a])
    return Interval(float(point), float(lo), float(hi))


def compare(
    counts: dict[str, PieceCounts],
    targets: Sequence[float],
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Comparison:
    """Percentile-bootstrap intervals of each model's recall at `targets` and of its
    difference from the first model, all models sharing each resample of the pieces (so every
    model must be scored on the same pieces)."""
    names = list(counts)
    if not names:
        raise ValueError("no models")
    pieces = {c.pieces for c in counts.values()}
    if len(pieces) != 1:
        raise ValueError(f"models scored on different numbers of pieces: {sorted(pieces)}")
    n_pieces = pieces.pop()
    first = counts[names[0]]
    for n in names[1:]:
        if not np.array_equal(counts[n].commands, first.commands):
            raise ValueError(f"{n} was scored on other streams than {names[0]}")
    w = resample_weights(n_pieces, resamples, seed)
    point = {n: recall_at_targets(c, targets)[0] for n, c in counts.items()}  # (T,)
    draws = {n: recall_at_targets(c, targets, w) for n, c in counts.items()}  # (B, T)
    recall = {
        n: [_interval(point[n][j], draws[n][:, j], level) for j in range(len(targets))]
        for n in names
    }
    mean_recall = {n: _interval(point[n].mean(), draws[n].mean(1), level) for n in names}
    diff, mean_diff, p_better = {}, {}, {}
    for n in names[1:]:
        d = draws[n] - draws[names[0]]
        dp = point[n] - point[names[0]]
        diff[n] = [_interval(dp[j], d[:, j], level) for j in range(len(targets))]
        mean_diff[n] = _interval(dp.mean(), d.mean(1), level)
        p_better[n] = float((d.mean(1) > 0).mean())
    return Comparison(
        names=names,
        targets=[float(t) for t in targets],
        level=level,
        resamples=resamples,
        pieces=n_pieces,
        recall=recall,
        mean_recall=mean_recall,
        diff=diff,
        mean_diff=mean_diff,
        p_better=p_better,
    )
