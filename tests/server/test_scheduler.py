"""The batching scheduler without sockets: end-of-stream edge cases, cancellation, failures."""

from __future__ import annotations

import asyncio

import torch

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, SamplingParams
from server.events import Done, Failed, Final, Progress, Token
from server.metrics import Metrics
from server.scheduler import Scheduler, SpeechStream, TextSession
from tests.conftest import LM_NAME, SPEECH_NAME
from tests.server.faults import install


async def next_event(q: asyncio.Queue, timeout: float = 30.0):
    return await asyncio.wait_for(q.get(), timeout)


async def final_of(st: SpeechStream) -> Final | Failed:
    """Read a stream's events up to its Final (or Failed)."""
    while True:
        ev = await next_event(st.events)
        if not isinstance(ev, Progress):
            return ev


async def tokens_of(g) -> tuple[list[int], Done | Failed]:
    toks = []
    while True:
        ev = await next_event(g.events)
        if not isinstance(ev, Token):
            return toks, ev
        toks.append(ev.id)


def make(models_dir, name: str) -> Scheduler:
    rec = load_recurrent(models_dir / name)
    eng = Engine(make_backend(rec, "torch"), name, 8, metadata=rec.checkpoint_metadata)
    return Scheduler(eng, Metrics(), max_batch_size=8, max_batch_wait_s=0.001)


def test_stream_ending_on_a_frame_boundary_and_empty_stream(models_dir):
    async def main():
        s = make(models_dir, SPEECH_NAME)
        s.start()
        rec = s.engine.backend
        x = torch.randn(1600, generator=torch.Generator().manual_seed(0))
        st = s.open_stream(await s.open_slot())
        await s.push_audio(st, x)
        while st.consumed < 1600:  # everything fed before the end message
            assert isinstance(await next_event(st.events), Progress)
        await s.end_audio(st)
        final = await final_of(st)
        _, ref = rec.chunk(x.unsqueeze(0), rec.init_state(1))
        assert isinstance(final, Final) and final.consumed == 1600
        assert torch.allclose(final.scores.logits, rec.scores(ref)[0].float(), atol=1e-5)
        probs = torch.softmax(rec.scores(ref)[0].double(), -1)  # (C,) reduced on the engine thread
        assert final.scores.top[0] == (int(probs.argmax()), round(float(probs.max()), 6))
        empty = s.open_stream(await s.open_slot())
        await s.end_audio(empty)  # no audio at all: scores of the zero state
        final0 = (await final_of(empty)).scores.logits
        assert torch.allclose(final0, rec.scores(rec.init_state(1))[0].float(), atol=1e-6)
        await s.stop()

    asyncio.run(main())


def test_cancelled_generation_keeps_session_consistent(models_dir):
    """Cancelling mid-generation leaves every sampled token fed or pending, so the state
    equals a session fed the same tokens directly."""

    async def main():
        s = make(models_dir, LM_NAME)
        s.start()
        bos = s.engine.tokenizer.bos
        sess = TextSession(slot=await s.open_slot(), pending=[bos, 104, 105])
        g = s.generate(sess, SamplingParams(temperature=0, max_tokens=50))
        toks = []
        while len(toks) < 5:
            ev = await next_event(g.events)
            toks.append(ev.id)
        s.cancel(g)
        await asyncio.wait_for(g.finished.wait(), 30)
        assert not sess.busy
        assert g.sampled[:5] == toks and len(g.sampled) >= 5
        # continuing feeds the pending tokens first: the state then holds every sampled token
        got = await s.prefill(sess, sess.pending + [33])
        ref = TextSession(slot=await s.open_slot(), pending=[])
        want = await s.prefill(ref, [bos, 104, 105, *g.sampled, 33])
        assert torch.allclose(got, want, atol=1e-4)
        await s.stop()

    asyncio.run(main())


def test_failed_audio_batch_reports_to_its_streams(models_dir):
    async def main():
        s = make(models_dir, SPEECH_NAME)
        faults = install(s)
        s.start()
        st = s.open_stream(await s.open_slot())
        faults.fail_next = RuntimeError("boom")
        await s.push_audio(st, torch.zeros(320))
        await s.end_audio(st)
        failed = await final_of(st)
        assert isinstance(failed, Failed) and "boom" in failed.message
        late = s.open_stream(await s.open_slot())  # fails while audio is queued, ends later
        faults.fail_next = RuntimeError("boom again")
        await s.push_audio(late, torch.zeros(320))
        failed = await next_event(late.events)
        assert isinstance(failed, Failed) and "boom again" in failed.message
        await s.end_audio(late)
        assert late.events.empty()  # nothing more after its failure
        other = s.open_stream(await s.open_slot())
        await s.push_audio(other, torch.zeros(320))
        await s.end_audio(other)
        assert (await final_of(other)).scores.logits.shape == (10,)
        await s.stop()

    asyncio.run(main())


def test_long_prompts_are_prefilled_in_slices_with_identical_results(models_dir):
    """A prompt longer than max_prefill_tokens is fed over several batches (so running
    decodes are not held up) and gives the same logits as one engine prefill."""

    async def main():
        s = make(models_dir, LM_NAME)
        s.max_prefill_tokens = 256
        s.start()
        toks = [int(t) for t in torch.randint(0, 256, (1000,), generator=torch.Generator())]
        sess = TextSession(slot=await s.open_slot(), pending=[])
        n0 = s.batches_run
        got = await s.prefill(sess, toks)
        assert s.batches_run - n0 == 4  # 256 + 256 + 256 + 232
        ref = s.engine.open()
        want = s.engine.prefill([ref], [toks])[0]
        assert torch.equal(got, want.float())
        await s.stop()

    asyncio.run(main())


def test_a_poisoned_row_fails_only_its_own_session(models_dir):
    """A row with non-finite outputs (a state driven out of range) fails its own session; the
    other rows of the same batches give exactly what they give alone."""

    async def main():
        s = make(models_dir, LM_NAME)
        faults = install(s)
        s.start()
        bos = s.engine.tokenizer.bos
        params = SamplingParams(temperature=0.8, seed=5, max_tokens=12)
        solo = TextSession(slot=await s.open_slot(), pending=[bos, 104, 105])
        want, done = await tokens_of(s.generate(solo, params))
        assert isinstance(done, Done) and len(want) == 12
        bad = TextSession(slot=await s.open_slot(), pending=[bos, 104, 105])
        good = TextSession(slot=await s.open_slot(), pending=[bos, 104, 105])
        faults.poison = {bad.slot}
        g_bad, g_good = s.generate(bad, params), s.generate(good, params)
        got, done = await tokens_of(g_good)
        failed = (await tokens_of(g_bad))[1]
        assert isinstance(failed, Failed) and "non-finite" in failed.message
        assert isinstance(done, Done) and got == want
        assert s.batches_run > 0 and not good.busy and not bad.busy
        await s.stop()

        sp = make(models_dir, SPEECH_NAME)
        faults = install(sp)
        sp.start()
        x = torch.randn(3200, generator=torch.Generator().manual_seed(1))
        ref = sp.open_stream(await sp.open_slot())
        await sp.push_audio(ref, x)
        await sp.end_audio(ref)
        want = (await final_of(ref)).scores
        bad = sp.open_stream(await sp.open_slot())
        good = sp.open_stream(await sp.open_slot())
        faults.poison = {bad.slot}
        for st in (bad, good):
            await sp.push_audio(st, x)
            await sp.end_audio(st)
        failed, final = await final_of(bad), await final_of(good)
        assert isinstance(failed, Failed) and "non-finite" in failed.message
        assert isinstance(final, Final) and final.scores.top == want.top
        assert torch.allclose(final.scores.logits, want.logits, atol=1e-6)
        await sp.stop()

    asyncio.run(main())


def test_resampling_and_class_scores_run_on_the_engine_thread(models_dir, monkeypatch):
    """The event loop only moves results: resampling a client's rate and the softmax/top-k of
    partials and finals run on the engine thread (one job for every waiting stream)."""
    import threading

    from dlr_runtime.engine import StreamResampler
    from server import scheduler as scheduler_module

    threads: dict[str, set[str]] = {"resample": set(), "top": set()}

    class Spy:
        def __init__(self, inner):
            self.inner = inner
            self.orig, self.new = inner.orig, inner.new

        def push(self, x):
            threads["resample"].add(threading.current_thread().name)
            return self.inner.push(x)

        def flush(self):
            threads["resample"].add(threading.current_thread().name)
            return self.inner.flush()

    real_top = scheduler_module.top_classes

    def top(rows):
        threads["top"].add(threading.current_thread().name)
        return real_top(rows)

    monkeypatch.setattr(scheduler_module, "top_classes", top)

    async def main():
        s = make(models_dir, SPEECH_NAME)
        s.start()
        x = torch.randn(44100, generator=torch.Generator().manual_seed(2))  # 1 s at 44.1 kHz
        streams = [
            s.open_stream(await s.open_slot(), Spy(StreamResampler(44100, 16000))) for _ in range(3)
        ]
        for st in streams:
            await s.push_audio(st, x)
            await s.end_audio(st)
        finals = [await final_of(st) for st in streams]
        await s.stop()
        return finals, threading.current_thread().name

    finals, loop_thread = asyncio.run(main())
    ref = StreamResampler(44100, 16000)
    n = ref.push(torch.randn(44100, generator=torch.Generator().manual_seed(2))).numel()
    n += ref.flush().numel()  # samples at 16 kHz of the whole stream
    assert all(isinstance(f, Final) and f.consumed == n for f in finals)
    assert threads["resample"] and threads["top"]
    assert all(t.startswith(f"engine-{SPEECH_NAME}") for t in threads["resample"] | threads["top"])
    assert loop_thread not in threads["resample"] | threads["top"]


def test_long_prefill_is_interleaved_with_other_sessions_decodes(models_dir):
    """While a generation is decoding, a long prompt is fed in pieces of at most
    max_prefill_tokens_decoding tokens and every batch holding a piece also holds the
    generation's decode step (so the stall between two of its tokens is one short piece);
    the prompt's logits equal one engine prefill."""

    async def main():
        s = make(models_dir, LM_NAME)
        piece = s.engine.prefill_block  # (pieces on block boundaries: identical results)
        s.max_prefill_tokens, s.max_prefill_tokens_decoding = 4 * piece, piece
        seen: list[tuple[list[int], int]] = []  # (piece lengths, decode rows) per batch
        execute = s._execute

        def spy(b):  # (records each batch's shape, then runs it for real)
            seen.append(([len(t) for _, t in b.prefill], len(b.decode)))
            return execute(b)

        s._execute = spy
        s.start()
        bos = s.engine.tokenizer.bos
        gen = TextSession(slot=await s.open_slot(), pending=[bos, 104])
        g = s.generate(gen, SamplingParams(temperature=0, max_tokens=400))
        assert isinstance(await next_event(g.events), Token)  # decoding from here on
        seen.clear()
        n = 3 * piece + 5
        toks = [int(t) for t in torch.randint(0, 256, (n,), generator=torch.Generator())]
        sess = TextSession(slot=await s.open_slot(), pending=[])
        got = await s.prefill(sess, toks)
        pieces = [(p, d) for p, d in seen if p]
        assert sum(sum(p) for p, _ in pieces) == n and len(pieces) == 4, pieces
        assert all(max(p) <= piece and d == 1 for p, d in pieces), pieces
        ref = s.engine.open()
        assert torch.equal(got, s.engine.prefill([ref], [toks])[0].float())
        s.cancel(g)
        await s.stop()

    asyncio.run(main())
