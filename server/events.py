"""Typed results that flow from the scheduler back to a session, one queue per session.

A generation's queue carries `Token`* then `Done` or `Failed`; a speech stream's queue carries
`Progress`* then `Final` or `Failed`. Consumers use `match ev:`. Class scores arrive already
reduced on the engine thread (`Scores`: probabilities of the top classes), so the event loop
never runs tensor math.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlr_runtime.listen import Heard

TOP_N = 5  # classes reported in a partial/final's `top`


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    logprob: float | None = None  # when the request asked for logprobs
    top: tuple[tuple[int, float], ...] = ()  # (id, logprob) of the most likely tokens


@dataclass(frozen=True)
class Done:
    reason: str  # "stop" | "length" | "cancelled"
    tail: str  # text held back until the end (stop-string lookahead), may be ""
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    message: str  # why this session's work failed (its row or its batch)


@dataclass(frozen=True)
class Scores:
    """The top classes of one score vector: (class index, probability), most likely first."""

    top: tuple[tuple[int, float], ...]
    logits: torch.Tensor  # (C,) the raw scores (tests compare them with the engine's)


@dataclass(frozen=True)
class Progress:
    consumed: int  # samples (model rate) fed to the state so far
    scores: Scores | None  # after the last completed frame; None when no frame completed
    heard: Heard | None = None  # continuous mode: detections and gate state of this batch


@dataclass(frozen=True)
class Final:
    consumed: int
    scores: Scores | None
    heard: Heard | None = None


GenEvent = Token | Done | Failed
SpeechEvent = Progress | Final | Failed
