"""The async batching scheduler of one model.

Contract: connection handlers only parse and enqueue (`prefill`, `generate`, `push_audio`,
`end_audio`); one loop per model forms batches and runs them on the engine in a single worker
thread, so every engine call (including slot allocation and freeing) is serialised. Each
iteration takes

- every running generation's next decode step (continuous batching, up to `max_batch_size`),
- waiting prefills (new prompts, appended text) up to `max_batch_size` rows,
- speech streams with pending audio, each feeding all its whole frames (at most
  `max_chunk_frames`; streams with equal amounts share a backend call: clients sending equal
  chunks at real-time pace mostly fall in one group); the partial-frame tail is fed only at
  end of stream,

and, when no generation is running, first waits up to `max_batch_wait` for more arrivals.
Results go back through one typed queue per generation (`Token`* then `Done` | `Failed`) and
per speech stream (`Progress`* then `Final` | `Failed`, see server/events.py); a prefill of
appended text resolves a future. Everything computed from model outputs (sampling, softmax and
top-k of class scores) and the resampling of client audio to the model's rate run on the engine
thread, batched across sessions; the event loop only moves results.

Failures are per row: a row whose outputs are not finite (or whose sampling raises) fails only
its own session, and the other rows of the batch complete as they would have alone (a
session's results do not depend on what else shares its batches, see `Engine`). An exception
of the engine call itself fails the sessions of that batch; the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from dlr_runtime.engine import (
    Engine,
    SamplingParams,
)
from dlr_runtime.engine.cached_prefill import plan_prefill
from dlr_runtime.engine.prefix_cache import PrefixCache
from dlr_runtime.engine.token_choice import ChoiceRow
from dlr_runtime.listen import feed_listening

from .events import Done, Failed, Final, Progress, Token
from .metrics import Metrics
from .work import (
    Batch,
    BatchError,
    Generation,
    Prefill,
    Resample,
    SpeechStream,
    TextSession,
    resample_all,
    sample_row,
    top_classes,
)


class Scheduler:
    """Batches the work of all sessions of one model onto its `Engine`."""

    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        max_batch_size: int = 64,
        max_batch_wait_s: float = 0.002,
        max_chunk_frames: int = 64,
        torch_threads: int = 0,
        max_prefill_tokens: int = 2048,
        prefix_cache: PrefixCache | None = None,
        max_prefill_tokens_decoding: int = 256,
    ) -> None:
        self.engine = engine
        self.prefix_cache = prefix_cache  # exact prompt states of this model (None: off)
        self.name = engine.name
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.max_batch_wait_s = max_batch_wait_s
        self.max_chunk_frames = max_chunk_frames
        block = engine.prefill_block  # slices on block boundaries keep each prompt's pieces
        self.max_prefill_tokens = max(1, max_prefill_tokens // block) * block
        # while generations are decoding, prompt pieces are shorter: every batch carries a
        # decode step of each running generation, so this bounds the stall a long prompt
        # adds between two tokens of another session
        shared = min(max_prefill_tokens_decoding, max_prefill_tokens)
        self.max_prefill_tokens_decoding = max(1, shared // block) * block
        self._executor = ThreadPoolExecutor(  # torch's thread count is per calling thread
            1,
            thread_name_prefix=f"engine-{engine.name}",
            initializer=torch.set_num_threads if torch_threads else None,
            initargs=(torch_threads,) if torch_threads else (),
        )
        self._prefills: list[tuple[Any, list[int]]] = []
        self._starting: list[Generation] = []
        self._running: OrderedDict[int, Generation] = OrderedDict()
        self._streams: OrderedDict[int, SpeechStream] = OrderedDict()
        self._resamples: list[Resample] = []
        self._wake = asyncio.Event()
        self._bg: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self._closed = False
        self.batches_run = 0
        self._in_batch = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"sched-{self.name}")

    async def stop(self) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for r in self._resamples:
            if not r.fut.done():
                r.fut.set_exception(BatchError("the server is stopping"))
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open_slot(self) -> int:
        slot = await self._call(self.engine.open)
        self.metrics.slots_in_use.labels(self.name).set(self.engine.pool.in_use)
        return slot

    async def close_slot(self, slot: int) -> None:
        await self._call(self.engine.close, slot)
        self.metrics.slots_in_use.labels(self.name).set(self.engine.pool.in_use)

    async def run_sync(self, fn, *args):
        """Run `fn(*args)` on the engine thread (between batches)."""
        return await self._call(fn, *args)

    # ------------------------------------------------------------------ text
    async def prefill(self, session: TextSession, tokens: list[int]) -> torch.Tensor:
        """Feed tokens into a text session's state; returns the logits after the last one
        (raises BatchError when its row or batch failed)."""
        fut = asyncio.get_running_loop().create_future()
        session.inflight = fut
        self._prefills.append((Prefill(fut, session.slot), list(tokens)))
        self._kick()
        logits = await asyncio.shield(fut)
        session.inflight = None
        session.last_logits = logits
        return logits

    async def prefill_prompt(
        self, session: TextSession, tokens: list[int], boundaries: Sequence[int] = ()
    ) -> int:
        """Prefill a whole prompt (bos first) into a fresh slot through the prefix cache:
        the longest cached prefix is loaded and only the rest is fed, in pieces that end at
        every insert point (each of `boundaries`, the branch point off the cache's keys, the
        end), whose states go into the cache. Sets `session.last_logits`; returns the
        number of prompt tokens served from the cache (raises BatchError like `prefill`)."""
        cache = self.prefix_cache
        if cache is None or cache.max_bytes == 0:
            plan = plan_prefill(self.engine, None, session.slot, tokens)  # (no engine access)
        else:  # loads the hit into the slot: on the engine thread, between batches
            plan = await self._call(
                plan_prefill, self.engine, cache, session.slot, tokens, boundaries
            )
        if plan.logits is not None:  # the whole prompt was cached
            session.last_logits = plan.logits.float().cpu()
            return plan.cached
        fut = asyncio.get_running_loop().create_future()
        session.inflight = fut
        self._prefills.append((Prefill(fut, session.slot, plan), list(plan.tokens[plan.cached :])))
        self._kick()
        session.last_logits = await asyncio.shield(fut)
        session.inflight = None
        return plan.cached

    def generate(
        self, session: TextSession, params: SamplingParams, choice: ChoiceRow | None = None
    ) -> Generation:
        """Start a generation: the session's pending tokens are fed, then tokens are sampled.

        Events on `Generation.events`: `Token`*, then `Done` or `Failed`. The last sampled
        token stays pending in the session. `choice` carries the OpenAI options (penalties,
        logit_bias, logprobs) and must share the generation's seed.
        """
        if session.busy:
            raise RuntimeError("a generation is already running in this session")
        if not session.pending and session.last_logits is None:
            raise ValueError("nothing to continue from: append text first")
        session.busy = True
        g = Generation(session, params, feed=list(session.pending), choice=choice)
        session.pending = []
        self._starting.append(g)
        self._kick()
        return g

    def cancel(self, g: Generation) -> None:
        """Stop a generation (its consumer went away) at the next batch boundary; every token
        already sampled ends up fed or pending, so the session stays usable."""
        if not g.done:
            g.cancelled = True
            self._kick()

    # ------------------------------------------------------------------ speech
    def open_stream(self, slot: int, resampler: Any = None) -> SpeechStream:
        """A stream of audio into `slot`; `resampler` converts the client's rate (None: the
        client sends the model's rate). Results arrive on `SpeechStream.events`."""
        s = SpeechStream(slot=slot, stride=self.engine.config.frame_stride, resampler=resampler)
        self._streams[s.seq] = s
        return s

    def _same_rate(self, s: SpeechStream) -> bool:
        r = s.resampler
        return r is None or r.orig == r.new

    async def push_audio(self, s: SpeechStream, samples: torch.Tensor) -> None:
        """Queue samples (L,) at the client's rate; returns once they are resampled (on the
        engine thread, batched with other streams) and waiting for a batch."""
        if s.ended:
            raise RuntimeError("the stream has ended")
        if self._same_rate(s):
            if s.resampler is not None:
                s.resampler.push(samples)  # bookkeeping only (no arithmetic at equal rates)
            self.queue_audio(s, samples)
            return
        await self._resample(s, samples)

    async def end_audio(self, s: SpeechStream) -> None:
        """Mark the end of a stream (the resampler's tail is queued first); a `Final` follows
        on `s.events` once all audio is fed."""
        if s.ended:
            return
        if not self._same_rate(s):
            await self._resample(s, None)
        s.ended = True
        self._kick()

    async def _resample(self, s: SpeechStream, samples: torch.Tensor | None) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._resamples.append(Resample(s, samples, fut))
        self._kick()
        await fut

    def queue_audio(self, s: SpeechStream, samples: torch.Tensor) -> None:
        """Queue samples already at the model's rate (a restored stream's buffer)."""
        if samples.numel():
            if samples.dtype != torch.float32 or samples.dim() != 1:
                samples = samples.to(torch.float32).reshape(-1)
            s.chunks.append(samples)
            s.buffered += samples.numel()
            s.received += samples.numel()
            if s.buffered >= s.stride:
                self._kick()

    def drop_stream(self, s: SpeechStream) -> None:
        self._streams.pop(s.seq, None)

    def streams(self) -> list[SpeechStream]:
        return list(self._streams.values())

    def queued_audio_s(self) -> float:
        """Audio waiting in every stream of this model (seconds at the model rate)."""
        rate = self.engine.config.sample_rate or 1
        return sum(s.buffered for s in self._streams.values()) / rate

    def queued_requests(self) -> int:
        return len(self._prefills) + len(self._starting)

    def idle(self) -> bool:
        """No generation running and no stream with whole frames (or an end) waiting."""
        return not (self._in_batch or self._has_work())

    async def snapshot(self, slot: int, extra_fn, engine_extra=None) -> bytes:
        """Snapshot a slot between batches. `extra_fn()` runs on the event loop right before
        the snapshot is queued on the engine thread (no await in between), so it sees exactly
        the bookkeeping that matches the state: every batch already formed runs first.
        `engine_extra()` (optional) runs on the engine thread right before the snapshot, for
        state the engine thread owns (a continuous stream's listener); its dict is merged in."""
        extra = extra_fn()

        def job() -> bytes:
            more = engine_extra() if engine_extra is not None else {}
            return self.engine.snapshot(slot, {**extra, **more})

        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    # ------------------------------------------------------------------ the loop
    def queue_depth(self) -> int:
        audio = sum(1 for s in self._streams.values() if self._audio_ready(s))
        return len(self._prefills) + len(self._starting) + audio

    def _kick(self) -> None:
        self._wake.set()

    def _audio_ready(self, s: SpeechStream) -> bool:
        return not s.failed and (s.buffered >= s.stride or (s.ended and not s.final_sent))

    def _has_work(self) -> bool:
        return bool(self._running or self._resamples or self.queue_depth())

    def _collect(self) -> Batch:
        b = Batch()
        cap = self.max_batch_size
        for g in list(self._running.values()):
            if g.cancelled:
                self._finish(g, "cancelled")
            elif len(b.decode) < cap:
                b.decode.append(g)  # oldest generations first
        n_pre = 0
        carry: list[tuple[Any, list[int]]] = []  # rest of long prompts, first in the next batch
        while self._prefills and n_pre < cap:
            item, toks = self._prefills.pop(0)
            self._add_prefill(b, item, toks, carry)
            n_pre += 1
        while self._starting and n_pre < cap:
            g = self._starting.pop(0)
            if g.cancelled:  # never started: give its tokens back to the session
                g.session.pending = g.feed + g.session.pending
                g.next_token = None
                self._finish(g, "cancelled")
                continue
            if g.feed:
                self._add_prefill(b, g, g.feed, carry)
                n_pre += 1
            else:
                b.sample_only.append(g)
        self._prefills[:0] = carry
        served = []
        for key, s in self._streams.items():
            if len(b.audio) >= cap:
                break
            if not self._audio_ready(s):
                continue
            if s.ended:
                n = s.buffered
            else:
                n = min(s.buffered // s.stride, self.max_chunk_frames) * s.stride
            b.audio.append((s, s.take(n)))
            final = s.ended and s.buffered == 0
            s.final_sent = s.final_sent or final
            b.audio_final.append(final)
            served.append(key)
        for key in served:  # round robin: served streams go to the back
            self._streams.move_to_end(key)
        return b

    def _add_prefill(self, b: Batch, item: Any, toks: list[int], carry: list) -> None:
        """Add at most `max_prefill_tokens` of a prompt (`max_prefill_tokens_decoding` when the
        batch has decode steps: a long prompt is interleaved with other sessions' tokens), never
        past a prefix-cache insert point; the rest waits in `carry`, first in the next batch."""
        n = self.max_prefill_tokens_decoding if b.decode else self.max_prefill_tokens
        plan = item.plan if isinstance(item, Prefill) else None
        end = None
        if plan is not None:
            end = plan.next_end(len(plan.tokens) - len(toks), n)
            n = end - (len(plan.tokens) - len(toks))
        b.prefill.append((item, toks[:n]))
        b.prefill_last.append(len(toks) <= n)
        b.prefill_end.append(end)
        if len(toks) > n:
            carry.append((item, toks[n:]))

    async def _loop(self) -> None:
        while not self._closed:
            self.metrics.queue_depth.labels(self.name).set(self.queue_depth())
            if not self._has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._resamples:
                await self._run_resamples()
            if not self._running and self.max_batch_wait_s > 0:
                await asyncio.sleep(self.max_batch_wait_s)
                if self._resamples:
                    await self._run_resamples()
            self._wake.clear()
            batch = self._collect()
            if batch.empty():
                await asyncio.sleep(0)
                continue
            self._in_batch = True
            try:
                result = await self._call(self._execute, batch)
            except Exception as e:  # noqa: BLE001  (fail this batch only, keep serving)
                self.metrics.batch_failures.labels(self.name).inc()
                self._fail(batch, e)
                continue
            finally:
                self._in_batch = False
            self.batches_run += 1
            self._deliver(batch, result)

    async def _run_resamples(self) -> None:
        jobs, self._resamples = self._resamples, []
        outs = await self._call(resample_all, jobs)
        for job, y in zip(jobs, outs, strict=True):
            if job.fut.done():
                continue
            if isinstance(y, BaseException):
                job.fut.set_exception(y)
            else:
                self.queue_audio(job.stream, y)
                job.fut.set_result(None)

    # ------------------------------------------------------------------ engine thread
    def _execute(self, b: Batch) -> dict[str, Any]:
        eng, m, name = self.engine, self.metrics, self.name
        out: dict[str, Any] = {"prefill": [], "decode": [], "sample": [], "audio": []}
        if b.prefill:
            t0 = time.perf_counter()
            slots = [self._slot_of(item) for item, _ in b.prefill]
            logits = eng.prefill(slots, [toks for _, toks in b.prefill]).float().cpu()  # (B, V)
            m.batch_latency.labels(name, "prefill").observe(time.perf_counter() - t0)
            m.batch_size.labels(name, "prefill").observe(len(slots))
            m.prompt_tokens.labels(name).inc(sum(len(t) for _, t in b.prefill))
            for (item, _), end, row in zip(b.prefill, b.prefill_end, logits, strict=True):
                if end is not None and bool(torch.isfinite(row).all()):
                    item.plan.reached(eng, item.slot, end, row)  # cache insert points
            for (item, _), last, row in zip(b.prefill, b.prefill_last, logits, strict=True):
                gen = item if last and isinstance(item, Generation) else None
                out["prefill"].append(sample_row(row, gen) if last else (row, None))
        for g in b.sample_only:
            out["sample"].append(sample_row(g.session.last_logits, g)[1])
        if b.decode:
            t0 = time.perf_counter()
            logits = eng.decode(
                [g.session.slot for g in b.decode], [g.next_token for g in b.decode]
            )
            logits = logits.float().cpu()  # (B, V)
            m.batch_latency.labels(name, "decode").observe(time.perf_counter() - t0)
            m.batch_size.labels(name, "decode").observe(len(b.decode))
            for g, row in zip(b.decode, logits, strict=True):
                out["decode"].append(sample_row(row, g))
        if b.audio:
            t0 = time.perf_counter()
            ys, heard, last = self._feed_streams(b)
            tops = top_classes(last)  # softmax + top-k of the batch's rows at once
            dt = time.perf_counter() - t0
            audio_s = sum(x.numel() for _, x in b.audio) / eng.config.sample_rate
            m.batch_latency.labels(name, "audio").observe(dt)
            m.batch_size.labels(name, "audio").observe(len(b.audio))
            m.audio_seconds.labels(name).inc(audio_s)
            if audio_s > 0:
                m.rtf.labels(name).observe(dt / audio_s)
            for y, h, top in zip(ys, heard, tops, strict=True):
                bad = isinstance(top, Failed) or (
                    not h.ok if h is not None else not bool(torch.isfinite(y).all())
                )
                out["audio"].append(
                    Failed("the model produced non-finite class scores") if bad else top
                )
            out["heard"] = heard
        return out

    def _feed_streams(self, b: Batch) -> tuple[list, list, list]:
        """Feed the batch's audio (engine thread): utterance streams straight into the engine,
        continuous ones through their listeners (gate + detector, dlr_runtime/listen.py).
        Returns per stream its score rows (utterance), what it heard (continuous) and the
        score row for its partial/final."""
        eng = self.engine
        n = len(b.audio)
        ys: list = [None] * n
        heard: list = [None] * n
        plain = [k for k, (s, _) in enumerate(b.audio) if s.listener is None]
        cont = [k for k, (s, _) in enumerate(b.audio) if s.listener is not None]
        if plain:
            got = eng.feed_audio(
                [b.audio[k][0].slot for k in plain], [b.audio[k][1] for k in plain]
            )
            for k, y in zip(plain, got, strict=True):
                ys[k] = y.float().cpu()  # (frames_k, C)
        if cont:
            streams = [b.audio[k][0] for k in cont]
            got = feed_listening(
                eng, [s.slot for s in streams], [s.listener for s in streams],
                [b.audio[k][1] for k in cont],
            )  # fmt: skip
            for k, h in zip(cont, got, strict=True):
                heard[k] = h
            m = self.metrics
            m.kws_frames.labels(self.name, "computed").inc(sum(h.computed for h in got))
            m.kws_frames.labels(self.name, "skipped").inc(sum(h.skipped for h in got))
            m.kws_detections.labels(self.name).inc(sum(len(h.detections) for h in got))
        finals = {}
        ended = [b.audio[k][0] for k in plain if b.audio_final[k]]
        if ended:
            sc = eng.scores([s.slot for s in ended]).float().cpu()  # (E, C)
            finals = {s.seq: row for s, row in zip(ended, sc, strict=True)}
        last = []
        for k, (s, _) in enumerate(b.audio):
            if heard[k] is not None:
                row = heard[k].scores
                last.append(None if row is None else row.float())
            else:
                y = ys[k]
                last.append(finals.get(s.seq, y[-1] if y.shape[0] else None))
        return ys, heard, last

    @staticmethod
    def _slot_of(item: Any) -> int:
        return item.session.slot if isinstance(item, Generation) else item.slot

    # ------------------------------------------------------------------ releasing slots
    def release(
        self, slot: int, session: TextSession | None = None, g: Generation | None = None
    ) -> None:
        """Free `slot` once no queued or running work uses it (safe to call from `finally`
        blocks of cancelled handlers: it does not await)."""

        async def _go() -> None:
            if g is not None and not g.done:
                self.cancel(g)
                await g.finished.wait()
            if session is not None and session.inflight is not None:
                with contextlib.suppress(Exception):  # its batch failed: the slot is still ours
                    await session.inflight
            await self.close_slot(slot)

        task = asyncio.get_running_loop().create_task(_go())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # ------------------------------------------------------------------ results
    def _deliver(self, b: Batch, out: dict[str, Any]) -> None:
        for (item, _), last, (row, tok) in zip(
            b.prefill, b.prefill_last, out["prefill"], strict=True
        ):
            if not last:
                continue
            if isinstance(tok, Failed):
                self._fail_item(item, BatchError(tok.message))
            elif isinstance(item, Generation):
                item.session.last_logits = row
                self._on_token(item, tok)
            elif not item.fut.done():
                item.fut.set_result(row)
        for g, tok in zip(b.sample_only, out["sample"], strict=True):
            if isinstance(tok, Failed):
                self._fail_gen(g, BatchError(tok.message))
            else:
                self._on_token(g, tok)
        for g, (row, tok) in zip(b.decode, out["decode"], strict=True):
            g.next_token = None
            if isinstance(tok, Failed):
                self._fail_gen(g, BatchError(tok.message))
                continue
            g.session.last_logits = row
            self._on_token(g, tok)
        rate = self.engine.config.sample_rate or 1
        heard = out.get("heard") or [None] * len(b.audio)
        for (s, x), final, top, h in zip(b.audio, b.audio_final, out["audio"], heard, strict=True):
            s.consumed += x.numel()
            if isinstance(top, Failed):
                self._fail_stream(s, BatchError(top.message))
                continue
            self.metrics.speech_lag.labels(self.name).observe((s.received - s.consumed) / rate)
            if final:
                s.events.put_nowait(Final(s.consumed, top, h))
            else:
                s.events.put_nowait(Progress(s.consumed, top, h))

    def _on_token(self, g: Generation, tok: int) -> None:
        now = time.perf_counter()
        g.sampled.append(tok)
        if g.cancelled:
            g.session.pending.append(tok)
            self._finish(g, "cancelled")
            return
        if g.n_generated == 0:
            self.metrics.ttft.labels(self.name).observe(now - g.created)
        else:
            self.metrics.itl.labels(self.name).observe(now - g.last_time)
        g.last_time = now
        g.n_generated += 1
        self.metrics.generated_tokens.labels(self.name).inc()
        tokenizer = self.engine.tokenizer
        if tok == tokenizer.eos:
            g.session.pending.append(tok)
            self._finish(g, "stop")
            return
        text, stopped = g.stop.feed(g.decoder.feed(tok))
        c = g.chosen
        if c is not None and c.logprob is not None:
            g.events.put_nowait(Token(tok, text, c.logprob, tuple(c.top)))
        else:
            g.events.put_nowait(Token(tok, text))
        if stopped:
            g.session.pending.append(tok)
            self._finish(g, "stop")
        elif g.n_generated >= g.params.max_tokens:
            g.session.pending.append(tok)
            self._finish(g, "length")
        else:
            g.next_token = tok
            self._running[g.seq] = g

    def _finish(self, g: Generation, reason: str) -> None:
        if g.done:
            return
        g.done = True
        self._running.pop(g.seq, None)
        if g.next_token is not None:  # sampled but never fed: keep it for the next turn
            g.session.pending.append(g.next_token)
            g.next_token = None
        g.session.busy = False
        g.finished.set()
        tail = "" if reason == "stop" else g.stop.feed(g.decoder.flush())[0] + g.stop.flush()
        g.events.put_nowait(Done(reason, tail, g.n_generated))

    def _fail(self, b: Batch, e: BaseException) -> None:
        """The engine call raised: every session of the batch fails."""
        err = BatchError(f"inference failed: {type(e).__name__}: {e}")
        failed = {id(item) for item, _ in b.prefill}
        self._prefills = [(i, t) for i, t in self._prefills if id(i) not in failed]
        for item, _ in b.prefill:
            self._fail_item(item, err)
        for g in b.sample_only + b.decode:
            self._fail_gen(g, err)
        for s, _ in b.audio:
            self._fail_stream(s, err)

    def _fail_item(self, item: Any, err: BatchError) -> None:
        if isinstance(item, Generation):
            self._fail_gen(item, err)
        elif not item.fut.done():
            item.fut.set_exception(err)

    def _fail_gen(self, g: Generation, err: BatchError) -> None:
        if g.done:
            return
        g.done = True
        g.finished.set()
        g.session.busy = False
        self._running.pop(g.seq, None)
        g.events.put_nowait(Failed(str(err)))

    def _fail_stream(self, s: SpeechStream, err: BatchError) -> None:
        if s.failed:
            return
        s.failed = True
        s.chunks, s.buffered = [], 0
        s.events.put_nowait(Failed(str(err)))


__all__ = ["BatchError", "Generation", "Scheduler", "SpeechStream", "TextSession"]
