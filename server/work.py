"""The units of work the scheduler batches, and what runs on the engine thread for them.

`TextSession` / `Generation` (text), `SpeechStream` (audio), the internal queue items and
`_Batch`, plus the per-row helpers `_execute` uses: sampling with per-row failure (`sample_row`),
softmax + top-k of score rows in one call (`top_classes`), resampling of waiting chunks
(`resample_all`). See server/scheduler.py for the loop that uses them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dlr_runtime.engine import IncrementalDecoder, SamplingParams, StopMatcher, sample_token
from dlr_runtime.engine.cached_prefill import PrefixPlan
from dlr_runtime.engine.token_choice import ChoiceRow, Chosen, choose_tokens
from dlr_runtime.listen import Listener

from .events import TOP_N, Failed, GenEvent, Scores, SpeechEvent

_ids = itertools.count()


class BatchError(RuntimeError):
    """The batch this session's work was in failed; the message says why."""


@dataclass
class TextSession:
    slot: int
    pending: list[int]  # tokens sampled or appended but not yet fed to the state
    last_logits: torch.Tensor | None = None  # (V,) logits after the last fed token
    busy: bool = False  # a generation is running
    inflight: asyncio.Future | None = None  # a prefill waiting for its batch


@dataclass
class Generation:
    session: TextSession
    params: SamplingParams
    feed: list[int]  # tokens to prefill before the first sample
    events: asyncio.Queue[GenEvent] = field(default_factory=asyncio.Queue)
    gen: torch.Generator | None = None
    decoder: IncrementalDecoder = field(default_factory=IncrementalDecoder)
    stop: StopMatcher | None = None
    next_token: int | None = None  # sampled, not yet fed
    sampled: list[int] = field(default_factory=list)  # every token sampled, in order
    n_generated: int = 0
    prompt_tokens: int = 0
    created: float = field(default_factory=time.perf_counter)
    last_time: float = 0.0
    done: bool = False
    cancelled: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    seq: int = field(default_factory=lambda: next(_ids))
    choice: ChoiceRow | None = None  # OpenAI options: penalties, logit_bias, logprobs
    chosen: Chosen | None = None  # the last token's logprobs (set on the engine thread)

    def __post_init__(self) -> None:
        self.gen = self.choice.gen if self.choice is not None else self.params.generator()
        self.stop = StopMatcher(self.params.stop)
        self.prompt_tokens = len(self.feed)


@dataclass
class SpeechStream:
    slot: int
    stride: int
    resampler: Any = None  # client rate -> model rate (StreamResampler); None: same rate
    listener: Listener | None = None  # continuous mode: gate + detector (engine thread only)
    chunks: list[torch.Tensor] = field(default_factory=list)  # waiting samples (model rate)
    buffered: int = 0  # samples waiting
    consumed: int = 0  # samples fed to the model
    received: int = 0  # samples queued (consumed + buffered + in the running batch)
    ended: bool = False  # no more audio; the final is due once everything is fed
    final_sent: bool = False
    failed: bool = False
    events: asyncio.Queue[SpeechEvent] = field(default_factory=asyncio.Queue)
    seq: int = field(default_factory=lambda: next(_ids))

    def take(self, n: int) -> torch.Tensor:
        if not self.chunks:
            return torch.zeros(0)
        x = torch.cat(self.chunks) if len(self.chunks) > 1 else self.chunks[0]  # (buffered,)
        head, rest = x[:n], x[n:]
        self.chunks = [rest] if rest.numel() else []
        self.buffered -= n
        return head


@dataclass
class Resample:
    stream: SpeechStream
    samples: torch.Tensor | None  # (L,) at the client rate; None = flush the resampler's tail
    fut: asyncio.Future  # resolved once the output is queued


@dataclass
class Prefill:
    fut: asyncio.Future  # resolved with the logits (V,) after the last token
    slot: int
    plan: PrefixPlan | None = None  # a fresh prompt through the prefix cache


@dataclass
class Batch:
    prefill: list[tuple[Any, list[int]]] = field(
        default_factory=list
    )  # (Generation|_Prefill, toks)
    prefill_last: list[bool] = field(default_factory=list)  # the item's last piece of prompt
    prefill_end: list[int | None] = field(default_factory=list)  # plan position after the piece
    sample_only: list[Generation] = field(default_factory=list)
    decode: list[Generation] = field(default_factory=list)
    audio: list[tuple[SpeechStream, torch.Tensor]] = field(default_factory=list)
    audio_final: list[bool] = field(default_factory=list)  # the stream's last row: send Final

    def empty(self) -> bool:
        return not (self.prefill or self.sample_only or self.decode or self.audio)


# ---------------------------------------------------------------------- engine-thread helpers
def sample_row(row: torch.Tensor, g: Generation | None) -> tuple[torch.Tensor, int | Failed | None]:
    """One row's logits (V,) and, for a generation, its sampled token; a row with non-finite
    logits (or whose sampling raises) becomes `Failed`, for its own session only."""
    if not bool(torch.isfinite(row).all()):
        return row, Failed("inference failed: the model produced non-finite logits")
    if g is None:
        return row, None
    try:
        if g.choice is not None:
            g.chosen = choose_tokens(row[None], [g.choice])[0]
            return row, g.chosen.token
        return row, sample_token(row, g.params, g.gen)
    except (ValueError, RuntimeError) as e:
        return row, Failed(f"inference failed: sampling: {e}")


def top_classes(rows: list[torch.Tensor | None]) -> list[Scores | Failed | None]:
    """Softmax probabilities and the top `TOP_N` classes of each score vector (C,), in one
    batched call; None stays None, a non-finite row becomes `Failed`."""
    idx = [i for i, r in enumerate(rows) if r is not None]
    out: list[Scores | Failed | None] = [None] * len(rows)
    if not idx:
        return out
    logits = torch.stack([rows[i] for i in idx])  # (K, C)
    probs = torch.softmax(logits.double(), dim=-1)  # (K, C)
    ok = torch.isfinite(probs).all(dim=-1).tolist()  # (K,)
    vals, order = torch.topk(probs, min(TOP_N, probs.shape[-1]), dim=-1)  # (K, n)
    for k, i in enumerate(idx):
        if not ok[k]:
            out[i] = Failed("the model produced non-finite class scores")
            continue
        top = tuple(
            (c, round(p, 6)) for c, p in zip(order[k].tolist(), vals[k].tolist(), strict=True)
        )
        out[i] = Scores(top, logits[k])
    return out


def resample_all(jobs: list[Resample]) -> list[torch.Tensor | BaseException]:
    """Resample every waiting chunk (engine thread); a failure is returned for its stream."""
    out: list[torch.Tensor | BaseException] = []
    for job in jobs:
        r = job.stream.resampler
        try:
            y = r.flush() if job.samples is None else r.push(job.samples)
            out.append(y)
        except Exception as e:  # noqa: BLE001  (only this stream's chunk fails)
            out.append(e)
    return out
