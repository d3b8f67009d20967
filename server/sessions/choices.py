"""The n choices of one OpenAI-style request (chat completions, completions, responses).

`open_choices(ctx, m, job, start=None)` takes a slot, prefills the job's prompt once (through
the prefix cache, with the message boundaries as insert points) and forks the state into
n - 1 more slots, so n > 1 costs one prefill and n - 1 state copies. Each choice then decodes
in its own generation with its own seed (`SamplingParams.seed` s + i) and its own penalties
and logprobs (`ChoiceRow`). A stored start (`StartState`: a snapshot blob and its pending
tokens, the continuation of a stored response) is restored into the slot instead, and the
prompt is fed on from it without the cache.

`Choices.events()` yields `(index, event)` for every choice (`Token`* then `Done` | `Failed`)
in the order the scheduler produced them; `Choices.close()` (idempotent) frees every slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from dlr_runtime.engine.slot_state import fork
from dlr_runtime.engine.token_choice import ChoiceRow

from ..context import AppContext
from ..events import Done, Failed, GenEvent, Token
from ..registry import ModelEntry
from ..work import BatchError, Generation, TextSession
from .store import owned_slot


@dataclass
class StartState:
    """Where a continuation starts: a slot snapshot and the tokens sampled but not yet fed."""

    blob: bytes
    pending: list[int]


class _Tagged:
    """A generation's event queue that tags its events with the choice index on one shared
    queue (the scheduler only calls `put_nowait`)."""

    def __init__(self, queue: asyncio.Queue, index: int) -> None:
        self.queue, self.index = queue, index

    def put_nowait(self, ev: GenEvent) -> None:
        self.queue.put_nowait((self.index, ev))


class Choices:
    """Owns the slots of one request's choices from `open_choices` until `close()`."""

    def __init__(self, ctx: AppContext, m: ModelEntry, job: Any, slot: int) -> None:
        self.ctx, self.m, self.job = ctx, m, job
        self.sessions = [TextSession(slot=slot, pending=[])]
        self.gens: list[Generation] = []
        self.cached_tokens = 0  # prompt tokens whose state came from the cache or a store
        self.prompt_tokens = len(job.tokens)
        self.queue: asyncio.Queue[tuple[int, GenEvent]] = asyncio.Queue()
        self.created = time.perf_counter()
        self.closed = False
        self.reason = "error"
        self.sid, self.t0 = ctx.session_started(m, "generate")

    @property
    def seeds(self) -> list[int | None]:
        return [p.seed for p in self.job.sampling]

    async def prefill(self, start: StartState | None) -> None:
        """The prompt once (cache or stored state), then n - 1 forks of the state."""
        sched, first, job = self.m.scheduler, self.sessions[0], self.job
        if start is None:
            self.cached_tokens = await sched.prefill_prompt(first, job.tokens, job.boundaries)
        else:
            await sched.run_sync(self.m.engine.restore, first.slot, start.blob)
            self.cached_tokens = 0
            first.last_logits = await sched.prefill(first, [*start.pending, *job.tokens])
            self.prompt_tokens = len(start.pending) + len(job.tokens)
        n = len(job.sampling)
        if n > 1:
            copies = await sched.run_sync(fork, self.m.engine, first.slot, n - 1)
            self.ctx.metrics.slots_in_use.labels(self.m.name).set(self.m.engine.pool.in_use)
            for s in copies.slots:
                self.sessions.append(TextSession(slot=s, pending=[], last_logits=first.last_logits))

    def start(self) -> None:
        vocab, dev = self.m.engine.config.vocab_size, "cpu"
        for i, (sess, params) in enumerate(zip(self.sessions, self.job.sampling, strict=True)):
            if params.max_tokens == 0:
                self.queue.put_nowait((i, Done("length", "", 0)))
                continue
            row = ChoiceRow.new(params, self.job.logits, vocab, dev)
            g = self.m.scheduler.generate(sess, params, choice=row)
            g.created = self.created
            g.events = _Tagged(self.queue, i)  # type: ignore[assignment]
            self.gens.append(g)

    async def events(self) -> AsyncIterator[tuple[int, GenEvent]]:
        """(choice index, event) until every choice has ended; closes when it ends."""
        try:
            left = len(self.sessions)
            while left:
                i, ev = await self.queue.get()
                if isinstance(ev, Done):
                    self.reason = ev.reason
                if not isinstance(ev, Token):
                    left -= 1
                yield i, ev
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        gens = {g.session.slot: g for g in self.gens}
        for s in self.sessions:
            self.m.scheduler.release(s.slot, s, gens.get(s.slot))
        self.ctx.session_ended(self.sid, self.m, "generate", self.t0, self.reason)


async def open_choices(
    ctx: AppContext, m: ModelEntry, job: Any, start: StartState | None = None
) -> Choices | Failed:
    """Prefill and start every choice of `job` (a `TextJob`); PoolFullError when the slots
    are not free (nothing is left taken), `Failed` when the prefill failed."""
    async with owned_slot(m) as slot:
        ch = Choices(ctx, m, job, slot)
    try:
        await ch.prefill(start)
    except BatchError as e:
        ch.close()
        return Failed(str(e))
    except BaseException:
        ch.close()
        raise
    ch.start()
    return ch


async def collect(ch: Choices) -> list[tuple[list[Token], str, Done]] | Failed:
    """Run every choice to its end: per choice its tokens, whole text and `Done`."""
    out: list[list[Any]] = [[[], [], None] for _ in ch.sessions]
    events = ch.events()
    async with contextlib.aclosing(events):
        async for i, ev in events:
            match ev:
                case Token(text=piece):
                    out[i][0].append(ev)
                    out[i][1].append(piece)
                case Done(tail=tail):
                    out[i][1].append(tail)
                    out[i][2] = ev
                case Failed():
                    return ev
    return [(toks, "".join(text), done) for toks, text, done in out]
