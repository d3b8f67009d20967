"""The keyword-spotting decision rule: per-frame class scores -> one detection per spoken command.

One rule for the evaluation (``dlr-eval speech``) and the server's continuous mode:

1. posteriors p_t = softmax(scores_t) over every label (commands, ``_silence_``, ``_unknown_``);
2. smoothing: the mean of the last ``smooth_ms`` of posteriors (a ring buffer);
3. a command c fires at frame t when its smoothed posterior reaches its threshold
   (``keywords[c]`` or ``threshold``), c is *armed* (its smoothed posterior fell below
   ``rearm * threshold`` since it last fired) and no detection happened in the last
   ``refractory_ms``;
4. ``start_ms`` is when c's smoothed posterior last rose above ``rearm * threshold``, ``end_ms``
   the end of the firing frame.

Pure numpy and fixed-size state (``snapshot``/``restore`` for resuming a stream); no torch in
the loop. The model's checkpoint metadata carries the default operating point under
``"detection"`` (``KWSConfig.from_metadata``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

SILENCE = "_silence_"
UNKNOWN = "_unknown_"


@dataclass
class KWSConfig:
    """Operating point of the detector."""

    threshold: float = 0.5  # smoothed posterior a command must reach to fire
    keywords: dict[str, float] = field(default_factory=dict)  # per-command thresholds
    listen: list[str] | None = None  # commands to detect (None: every command)
    smooth_ms: float = 100.0  # posterior smoothing window
    refractory_ms: float = 800.0  # no detection this soon after the previous one
    rearm: float = 0.5  # a command re-arms once its posterior falls below rearm * threshold

    def validate(self, labels: list[str]) -> None:
        """Raise ValueError naming the first bad option (unknown keyword, range)."""
        commands = commands_of(labels)
        for name in list(self.keywords) + list(self.listen or []):
            if name not in commands:
                raise ValueError(f"unknown keyword {name!r}; the model's commands are {commands}")
        for name, value in [("threshold", self.threshold), *self.keywords.items()]:
            if not 0.0 < float(value) <= 1.0:
                raise ValueError(f"threshold for {name!r} must be in (0, 1], got {value!r}")
        if self.smooth_ms < 0 or self.refractory_ms < 0:
            raise ValueError("smooth_ms and refractory_ms must be >= 0")
        if not 0.0 <= self.rearm <= 1.0:
            raise ValueError(f"rearm must be in [0, 1], got {self.rearm}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KWSConfig:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any] | None) -> KWSConfig:
        """The operating point stored in a checkpoint's metadata (defaults when absent)."""
        return cls.from_dict((metadata or {}).get("detection") or {})


@dataclass(frozen=True)
class Detection:
    """One detected command."""

    label: str
    score: float  # smoothed posterior when it fired
    start_ms: float  # when the evidence began rising
    end_ms: float  # end of the frame that fired
    frame: int  # index of that frame since the stream started


def commands_of(labels: list[str]) -> list[str]:
    """The labels that are commands (everything but _silence_ / _unknown_)."""
    return [lab for lab in labels if lab not in (SILENCE, UNKNOWN)]


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (..., C) scores in float64."""
    z = np.asarray(scores, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class KeywordSpotter:
    """Streaming detector for one stream: `push(scores)` per frame -> detections."""

    def __init__(self, labels: list[str], frame_ms: float, config: KWSConfig | None = None) -> None:
        self.labels = list(labels)
        self.config = config or KWSConfig()
        self.config.validate(self.labels)
        self.frame_ms = float(frame_ms)
        listen = self.config.listen or commands_of(self.labels)
        self.cmd_idx = np.array([self.labels.index(c) for c in listen], np.int64)  # (K,)
        self.thresholds = np.array(
            [
                float(self.config.keywords.get(self.labels[i], self.config.threshold))
                for i in self.cmd_idx
            ]
        )  # (K,)
        self.k = max(1, int(round(self.config.smooth_ms / self.frame_ms)))
        self.refractory = int(round(self.config.refractory_ms / self.frame_ms))
        self._quiet = self.quiet()
        self.reset()

    def reconfigure(self, config: KWSConfig) -> None:
        """Change the operating point mid-stream (ValueError, nothing changed, if invalid).

        The posterior history (ring, sum, frame count, last firing) carries over, so smoothing
        and the refractory period continue across the change; a command kept by the new
        `listen` keeps its arming and rise frame, a newly added one starts armed. The
        smoothing window cannot change (the ring's length is the stream's).
        """
        config.validate(self.labels)
        if int(max(1, round(config.smooth_ms / self.frame_ms))) != self.k:
            raise ValueError("smooth_ms cannot change in the middle of a stream")
        new = KeywordSpotter(self.labels, self.frame_ms, config)
        old = {int(c): j for j, c in enumerate(self.cmd_idx)}
        armed = np.ones(len(new.cmd_idx), bool)
        rise = np.full(len(new.cmd_idx), self.frame, np.int64)
        for j, c in enumerate(new.cmd_idx):
            if int(c) in old:
                armed[j], rise[j] = self.armed[old[int(c)]], self.rise[old[int(c)]]
        self.config, self.cmd_idx, self.thresholds = config, new.cmd_idx, new.thresholds
        self.refractory = new.refractory
        self.armed, self.rise = armed, rise

    def reset(self) -> None:
        c = len(self.labels)
        self.ring = np.zeros((self.k, c))  # last k posteriors
        self.sum = np.zeros(c)
        self.frame = 0  # frames seen
        self.last_fire = -(10**9)
        self.armed = np.ones(len(self.cmd_idx), bool)
        self.rise = np.zeros(len(self.cmd_idx), np.int64)  # frame each command began rising
        self.quiet_rows = 0  # the newest ring rows that hold quiet() (at most k)

    def push(self, scores: np.ndarray) -> Detection | None:
        """One frame's class scores (C,) (logits) -> a Detection or None."""
        return self.push_posterior(softmax(scores))

    def quiet(self) -> np.ndarray:
        """The posterior (C,) of a frame a voice-activity gate skipped: one-hot `_silence_`
        (all zeros for a model without `_silence_`)."""
        q = np.zeros(len(self.labels))
        if SILENCE in self.labels:
            q[self.labels.index(SILENCE)] = 1.0
        return q

    def skip(self, n: int) -> None:
        """`n` skipped frames: exactly `n` calls of `push_posterior(quiet())`, in O(k) at most.

        A quiet frame never fires (command posteriors only fall). Once the ring holds only
        quiet rows, a further quiet push leaves ring and sum bit-identical (it adds q - q = 0),
        so the rest of the run only moves the frame counter and the re-arm bookkeeping.
        """
        q = self._quiet
        while n > 0 and self.quiet_rows < self.k:  # (the ring is all quiet once k are)
            self.push_posterior(q)
            n -= 1
        if n <= 0:
            return
        n_seen = min(self.frame + 1, self.k)
        low = self.sum[self.cmd_idx] / n_seen < self.config.rearm * self.thresholds
        self.frame += n
        self.rise = np.where(low, self.frame, self.rise)
        self.armed |= low

    def push_posterior(self, p: np.ndarray) -> Detection | None:
        """One frame's posterior (C,) (probabilities) -> a Detection or None."""
        # quiet pushes in a row (a caller's array equal to quiet() counts as speech: this
        # only delays the shortcut of `skip`, which is exact either way)
        self.quiet_rows = min(self.quiet_rows + 1, self.k) if p is self._quiet else 0
        slot = self.frame % self.k
        self.sum += p - self.ring[slot]
        self.ring[slot] = p
        n = min(self.frame + 1, self.k)
        smooth = self.sum[self.cmd_idx] / n  # (K,)
        low = smooth < self.config.rearm * self.thresholds
        self.rise = np.where(low, self.frame + 1, self.rise)
        self.armed |= low
        t = self.frame
        self.frame += 1
        hot = (smooth >= self.thresholds) & self.armed
        if not hot.any() or t - self.last_fire < self.refractory:
            return None
        j = int(np.argmax(np.where(hot, smooth, -1.0)))
        self.armed[j] = False
        self.last_fire = t
        return Detection(
            label=self.labels[int(self.cmd_idx[j])],
            score=float(smooth[j]),
            start_ms=float(self.rise[j] * self.frame_ms),
            end_ms=float((t + 1) * self.frame_ms),
            frame=t,
        )

    def run(self, scores: np.ndarray) -> list[Detection]:
        """Push every row of (T, C) scores; return the detections in order."""
        out = []
        for row in np.asarray(scores):
            d = self.push(row)
            if d is not None:
                out.append(d)
        return out

    def snapshot(self) -> dict[str, Any]:
        """The detector's state as plain values (for resume/export)."""
        return {
            "ring": self.ring.tolist(),
            "sum": self.sum.tolist(),
            "frame": self.frame,
            "last_fire": self.last_fire,
            "armed": self.armed.tolist(),
            "rise": self.rise.tolist(),
        }

    def restore(self, snap: dict[str, Any]) -> None:
        self.ring = np.array(snap["ring"], np.float64).reshape(self.k, len(self.labels))
        self.sum = np.array(snap["sum"], np.float64)
        self.frame = int(snap["frame"])
        self.last_fire = int(snap["last_fire"])
        self.armed = np.array(snap["armed"], bool)
        self.rise = np.array(snap["rise"], np.int64)
        self.quiet_rows = self.k if bool((self.ring == self._quiet).all()) else 0


def detect(
    scores: np.ndarray, labels: list[str], frame_ms: float, config: KWSConfig | None = None
) -> list[Detection]:
    """Offline: every detection in (T, C) scores of one stream."""
    return KeywordSpotter(labels, frame_ms, config).run(scores)
