"""A voice-activity gate per stream: which whole frames the model computes, which it skips.

Each model frame (``frame_stride`` samples) is *voiced* when its RMS is above ``floor_dbfs``
(a cheap vectorised pre-check: digital silence and very quiet rooms never reach the VAD) and
WebRTC's VAD (``webrtcvad``, C, microseconds per 10 ms) calls any 10 ms piece of it speech.
The gate opens at a voiced frame and closes after ``hangover_ms`` without one.

The rule for the model's state (exact, and what the tests check):

- while the gate is closed the frames are not computed;
- when it opens, the slot's state is **reset to zero** and the last ``preroll_ms`` of audio
  before the opening frame is fed first, then the frames while it stays open;

so every open segment is computed exactly as the ungated model computes that segment's audio
(pre-roll included) as a fresh stream. Gate decisions depend only on the audio, never on how
it was chunked. The gate's state (open, frames since the last voiced one, pre-roll samples) is
fixed-size and round-trips through `snapshot` / `restore`.
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

try:  # the C WebRTC VAD (webrtcvad-wheels); the energy pre-check alone without it
    import webrtcvad
except ImportError:  # pragma: no cover
    webrtcvad = None

VAD_RATES = (8000, 16000, 32000, 48000)


@dataclass
class GateConfig:
    """Operating point of the gate."""

    enabled: bool = True  # False: every frame is computed (no gate)
    aggressiveness: int = 2  # webrtcvad mode 0..3 (3 rejects the most non-speech)
    floor_dbfs: float = -55.0  # frames quieter than this (RMS, dB full scale) are silence
    hangover_ms: float = 400.0  # the gate stays open this long after the last voiced frame
    preroll_ms: float = 200.0  # audio before the opening frame fed after the reset

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateConfig:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Run:
    """Consecutive frames with one decision. `feed`: compute `samples` (after a `reset` of
    the state when set), whose first `lead` frames are pre-roll already seen as skipped;
    otherwise skip `frames` frames."""

    feed: bool
    frames: int  # frames of this chunk in the run (pre-roll not counted)
    samples: np.ndarray | None = None  # (lead + frames) * stride samples to compute
    reset: bool = False
    lead: int = 0


class Gate:
    """The gate of one stream (see the module docstring)."""

    def __init__(self, stride: int, rate: int, config: GateConfig | None = None) -> None:
        self.config = config or GateConfig()
        self.stride, self.rate = stride, rate
        frame_ms = stride / rate * 1000
        self.hangover = int(round(self.config.hangover_ms / frame_ms))
        self.n_pre = int(round(self.config.preroll_ms / frame_ms))
        self.floor = 10 ** (self.config.floor_dbfs / 20)
        self.sub = rate // 100  # 10 ms pieces for webrtcvad
        self.vad = None
        if webrtcvad is not None and rate in VAD_RATES and stride % self.sub == 0:
            self.vad = webrtcvad.Vad(int(self.config.aggressiveness))
        self.reset()

    def reset(self) -> None:
        self.open = False
        self.quiet = 0  # frames since the last voiced one
        self.pre = np.zeros((0, self.stride), np.float32)  # last <= n_pre frames

    def voiced(self, frames: np.ndarray) -> np.ndarray:
        """(F, stride) float samples -> (F,) bool."""
        rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))  # (F,)
        out = rms > self.floor
        if self.vad is None:
            return out
        pcm = (np.clip(frames, -1.0, 1.0) * 32767).astype("<i2")  # (F, stride)
        for i in np.flatnonzero(out):
            row = pcm[i]
            out[i] = any(
                self.vad.is_speech(row[j : j + self.sub].tobytes(), self.rate)
                for j in range(0, self.stride, self.sub)
            )
        return out

    def plan(self, x: np.ndarray) -> list[Run]:
        """Decide a chunk of whole frames (F * stride,) -> runs in order (the state moves)."""
        f = x.size // self.stride
        if f == 0:
            return []
        frames = x[: f * self.stride].reshape(f, self.stride).astype(np.float32, copy=False)
        if not self.config.enabled:
            self.open = True
            return [Run(True, f, frames.reshape(-1))]
        voiced = self.voiced(frames)
        decide = np.empty(f, bool)
        opens = np.zeros(f, bool)
        for i in range(f):
            if voiced[i]:
                opens[i] = not self.open
                self.open, self.quiet = True, 0
            elif self.open:
                self.quiet += 1
                if self.quiet > self.hangover:
                    self.open = False
            decide[i] = self.open
        runs: list[Run] = []
        i = 0
        while i < f:
            j = i + 1
            while j < f and decide[j] == decide[i] and not opens[j]:
                j += 1
            if decide[i]:
                lead = np.zeros((0, self.stride), np.float32)
                if opens[i]:  # the frames before i: the pre-roll kept so far + this chunk's
                    lead = np.concatenate([self.pre, frames[:i]])[-self.n_pre :]
                    if self.n_pre == 0:
                        lead = lead[:0]
                samples = np.concatenate([lead, frames[i:j]]).reshape(-1)
                runs.append(Run(True, j - i, samples, bool(opens[i]), len(lead)))
            else:
                runs.append(Run(False, j - i))
            i = j
        if self.n_pre:
            self.pre = np.concatenate([self.pre, frames])[-self.n_pre :]
        return runs

    def snapshot(self) -> dict[str, Any]:
        pre = base64.b64encode(self.pre.astype("<f4").tobytes()).decode()
        return {"open": self.open, "quiet": self.quiet, "pre": pre}

    def restore(self, snap: dict[str, Any]) -> None:
        raw = base64.b64decode(snap["pre"], validate=True)
        pre = np.frombuffer(raw, "<f4").astype(np.float32)
        if pre.size % self.stride or pre.size // self.stride > self.n_pre:
            raise ValueError("gate pre-roll does not fit this stream")
        if not np.isfinite(pre).all():
            raise ValueError("gate pre-roll must be finite")
        self.pre = pre.reshape(-1, self.stride)
        self.open, self.quiet = bool(snap["open"]), int(snap["quiet"])
