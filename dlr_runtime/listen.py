"""Continuous listening: a stream's voice-activity gate and keyword detector, fed with its batch.

`Listener` is *all* the state a continuous stream has besides the model's slot: the gate
(`vad.Gate`), the detector (`kws.KeywordSpotter`) and the detections so far; `snapshot()` /
`Listener.restore()` round-trip it as plain JSON values, next to the slot's state snapshot.

`feed_listening(engine, slots, listeners, chunks)` runs on the engine thread: each stream's gate
turns its chunk of whole frames into runs (compute, after a reset when the gate resets, or skip;
see vad.py), computed runs are fed whole (cutting them into power-of-two pieces, so that equal
pieces of streams share a call, cost 1.4x the CPU of speaking streams in
benchmarks/bench_kws.py: more, smaller calls);
the runs of every stream are fed round by round (each round one `engine.feed_audio` call for all
streams that have a run to compute; streams with runs of equal length share the backend call),
and every frame reaches the detector in stream order: computed frames as their class scores,
skipped frames as the quiet posterior (`KeywordSpotter.skip`). Pre-roll frames fed when the gate
opens are not pushed again (the detector saw them when they were skipped).

`gated_scores(model, audio, gate)` is the same rule for one whole recorded stream, for
evaluation: the rows the detector sees, with each skipped frame as scores whose softmax is the
quiet posterior exactly, so `KeywordSpotter.run` over them makes the server's detections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .kws import SILENCE, Detection, KeywordSpotter, KWSConfig
from .vad import Gate, GateConfig, Run

MAX_KEPT = 10000  # detections a listener keeps for the stream's final message


@dataclass(frozen=True)
class Heard:
    """What one chunk of a continuous stream produced."""

    detections: tuple[Detection, ...]
    scores: torch.Tensor | None  # (C,) class scores after the last computed frame, if any
    speech: bool  # the gate is open after this chunk
    computed: int  # frames computed (pre-roll included)
    skipped: int  # frames skipped by the gate
    ok: bool = True  # False: the model produced non-finite scores for this stream
    total: int = 0  # detections of the stream so far, these included (numbers them)


class Listener:
    """Gate + detector + detections of one continuous stream."""

    def __init__(
        self,
        labels: list[str],
        stride: int,
        rate: int,
        kws: KWSConfig | None = None,
        gate: GateConfig | None = None,
    ) -> None:
        self.frame_ms = stride / rate * 1000
        self.spotter = KeywordSpotter(labels, self.frame_ms, kws)
        self.gate = Gate(stride, rate, gate)
        self.detections: list[Detection] = []
        self.n_detections = 0  # every detection since the stream started (numbers them)
        self.speech = False

    def heard(self, det: Detection) -> None:
        self.n_detections += 1
        self.detections = (self.detections + [det])[-MAX_KEPT:]

    def snapshot(self) -> dict[str, Any]:
        return {
            "kws": self.spotter.config.to_dict(),
            "gate_config": self.gate.config.to_dict(),
            "spotter": self.spotter.snapshot(),
            "gate": self.gate.snapshot(),
            "detections": [d.__dict__ for d in self.detections],
            "n_detections": self.n_detections,
            "speech": self.speech,
        }

    @classmethod
    def restore(cls, snap: dict[str, Any], labels: list[str], stride: int, rate: int) -> Listener:
        """Rebuild a listener from `snapshot()` (ValueError / KeyError / TypeError if malformed)."""
        kws = KWSConfig.from_dict(snap["kws"])
        lis = cls(labels, stride, rate, kws, GateConfig.from_dict(snap["gate_config"]))
        lis.spotter.restore(snap["spotter"])
        lis.gate.restore(snap["gate"])
        lis.detections = [Detection(**d) for d in snap["detections"]][-MAX_KEPT:]
        lis.n_detections = int(snap["n_detections"])
        lis.speech = bool(snap["speech"])
        return lis


@dataclass(frozen=True)
class _Step:
    """One run: compute `samples` (after a reset if set) and push all but the first `drop` rows
    (the re-fed pre-roll) to the detector, or skip `skip` frames."""

    samples: np.ndarray | None = None
    reset: bool = False
    drop: int = 0
    skip: int = 0


def _steps(runs: list[Run], stride: int) -> list[_Step]:
    """One step per run: compute it whole (on opening, its pre-roll `lead` frames are
    computed but not pushed again), or skip it."""
    steps: list[_Step] = []
    for run in runs:
        if not run.feed:
            steps.append(_Step(skip=run.frames))
            continue
        n = run.lead + run.frames
        steps.append(_Step(run.samples[: n * stride], run.reset, min(run.lead, n)))
    return steps


def feed_listening(
    engine: Any, slots: list[int], listeners: list[Listener], chunks: list[torch.Tensor]
) -> list[Heard]:
    """Feed continuous streams their chunks (whole frames; a partial tail is dropped) through
    their gates; returns per stream what it heard (see the module docstring)."""
    stride = engine.config.frame_stride
    plans: list[list[_Step]] = [
        _steps(lis.gate.plan(x.detach().cpu().numpy().reshape(-1)), stride)
        for lis, x in zip(listeners, chunks, strict=True)
    ]
    found: list[list[Detection]] = [[] for _ in slots]
    last: list[torch.Tensor | None] = [None] * len(slots)
    computed = [0] * len(slots)
    skipped = [0] * len(slots)
    ok = [True] * len(slots)
    for r in range(max((len(p) for p in plans), default=0)):
        rows = [i for i, p in enumerate(plans) if r < len(p)]
        feed = [i for i in rows if plans[i][r].samples is not None]
        for i in feed:
            if plans[i][r].reset:
                engine.reset(slots[i])
        ys = engine.feed_audio(
            [slots[i] for i in feed], [torch.from_numpy(plans[i][r].samples) for i in feed]
        )
        out = dict(zip(feed, ys, strict=True))
        for i in rows:
            step, lis = plans[i][r], listeners[i]
            if step.samples is None:
                lis.spotter.skip(step.skip)
                skipped[i] += step.skip
                continue
            y = out[i].double().cpu()  # (piece frames, C)
            if not ok[i] or not bool(torch.isfinite(y).all()):
                ok[i] = False
                continue
            computed[i] += y.shape[0]
            last[i] = y[-1]
            for row in y[step.drop :].numpy():
                det = lis.spotter.push(row)
                if det is not None:
                    lis.heard(det)
                    found[i].append(det)
    heard = []
    for i, lis in enumerate(listeners):
        lis.speech = lis.gate.open
        heard.append(
            Heard(
                tuple(found[i]),
                last[i],
                lis.speech,
                computed[i],
                skipped[i],
                ok[i],
                lis.n_detections,
            )  # fmt: skip
        )
    return heard


def gated_scores(model: Any, audio: np.ndarray, gate: GateConfig | None = None) -> np.ndarray:
    """One whole stream (samples (L,)) through its gate and `model` (anything with `config`,
    `init_state` and `chunk`, e.g. a `RecurrentModel`) as the server computes it -> (F, C) rows
    for the detector: computed frames' class scores (pre-roll not repeated) and, for frames the
    gate skipped, 0 for `_silence_` and -inf elsewhere (softmax: the quiet posterior)."""
    cfg = model.config
    if SILENCE not in cfg.labels:
        raise ValueError(f"gated scoring needs a {SILENCE} label for the skipped frames")
    quiet = np.full(len(cfg.labels), -np.inf)
    quiet[cfg.labels.index(SILENCE)] = 0.0
    state = model.init_state(1)
    rows: list[np.ndarray] = [np.zeros((0, len(cfg.labels)))]
    runs = Gate(cfg.frame_stride, cfg.sample_rate, gate).plan(np.asarray(audio, np.float32))
    for step in _steps(runs, cfg.frame_stride):
        if step.samples is None:
            rows.append(np.broadcast_to(quiet, (step.skip, quiet.size)))
            continue
        if step.reset:
            state = model.init_state(1)
        y, state = model.chunk(torch.from_numpy(step.samples).unsqueeze(0), state)
        rows.append(y[0, step.drop :].double().cpu().numpy())
    return np.concatenate(rows)
