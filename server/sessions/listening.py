"""Continuous mode of a speech session: its options, its listener and its messages.

`start` with `"mode": "continuous"` builds a `dlr_runtime.listen.Listener` (voice-activity gate
+ the keyword detector of `dlr_runtime.kws`, the rule the model card's evaluation uses). Its
operating point is the model's (`KWSConfig.from_metadata`: the checkpoint metadata's
`"detection"`), overridden per session by `threshold`, `keywords` ({command: threshold}),
`listen` (the commands to detect) and `refractory_ms`; `vad: false` computes every frame.
A session's `threshold` given without `keywords` applies to every command but the session's
own per-command thresholds: a model's per-command defaults give way to it (`session_point`).
Unknown commands or options outside utterance mode are refused (ValueError -> `error`
`invalid_message`, close 1008).

Messages: one `detection` per detected command (numbered like every message, so a resumed
stream replays the ones it missed and never repeats one), partials carry `vad`
("speech" | "silence") and the detection count, the final lists the stream's detections.
"""

from __future__ import annotations

from typing import Any

from dlr_runtime.engine import Engine
from dlr_runtime.kws import SILENCE, Detection, KWSConfig
from dlr_runtime.listen import Listener
from dlr_runtime.vad import GateConfig

from ..protocol import SpeechStart

OPTIONS = ("threshold", "keywords", "listen", "refractory_ms")


def make_listener(start: SpeechStart, engine: Engine) -> Listener | None:
    """The listener of a continuous stream (None in utterance mode); ValueError names a bad
    option."""
    given = [k for k in (*OPTIONS, "vad") if k in start.model_fields_set]
    if start.mode != "continuous":
        if given:
            raise ValueError(f'{", ".join(given)} need "mode": "continuous"')
        return None
    cfg = engine.config
    options = start.model_dump(include=set(OPTIONS), exclude_none=True)
    kws = session_point(KWSConfig.from_metadata(engine.metadata), options, None)
    kws.validate(list(cfg.labels))
    return Listener(
        list(cfg.labels), cfg.frame_stride, cfg.sample_rate, kws, GateConfig(enabled=start.vad)
    )


def session_point(
    point: KWSConfig, changes: dict[str, Any], own_keywords: dict[str, float] | None
) -> KWSConfig:
    """`point` with a session's option `changes` (`threshold`, `keywords`, `listen`,
    `refractory_ms`). A `threshold` without `keywords` applies to every command except the
    session's own per-command thresholds (`own_keywords`): per-command thresholds that came
    with the model give way to it, so one slider moves every command."""
    data = {**point.to_dict(), **changes}
    if "threshold" in changes and "keywords" not in changes:
        data["keywords"] = dict(own_keywords or {})
    return KWSConfig.from_dict(data)


def detection_message(det: Detection, index: int) -> dict[str, Any]:
    """A `detection` message (`index`: 1-based number of the detection in its stream)."""
    return {
        "type": "detection",
        "index": index,
        "label": det.label,
        "score": round(det.score, 6),
        "start_ms": round(det.start_ms, 1),
        "end_ms": round(det.end_ms, 1),
    }


def listening_fields(
    speech: bool, count: int, labels: list[str], msg: dict[str, Any]
) -> dict[str, Any]:
    """Add the continuous-mode fields to a partial/final: gate state, detection count; while
    the gate is closed the top label is `_silence_` (the gate's verdict, also for a model
    without that label)."""
    out = {**msg, "mode": "continuous", "vad": "speech" if speech else "silence"}
    out["detections_count"] = count
    if not speech:
        out.update(label=SILENCE, score=1.0, top=[{"label": SILENCE, "score": 1.0}])
    return out


def final_detections(lis: Listener) -> list[dict[str, Any]]:
    """The stream's detections for its final message, numbered from 1."""
    first = lis.n_detections - len(lis.detections) + 1
    return [detection_message(d, first + i) for i, d in enumerate(lis.detections)]
