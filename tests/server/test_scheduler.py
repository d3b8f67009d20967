"""The batching scheduler without sockets: end-of-stream edge cases, cancellation, failures."""

from __future__ import annotations

import asyncio

import pytest
import torch

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, SamplingParams
from server.metrics import Metrics
from server.scheduler import BatchError, Scheduler, TextSession
from tests.conftest import LM_NAME, SPEECH_NAME


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
        s.push_audio(st, x)
        while st.consumed < 1600:  # everything fed before the end message
            await st.progress.wait()
            st.progress.clear()
        final = await s.end_audio(st)
        _, ref = rec.chunk(x.unsqueeze(0), rec.init_state(1))
        assert torch.allclose(final, rec.scores(ref)[0].float(), atol=1e-5)
        empty = s.open_stream(await s.open_slot())
        final0 = await s.end_audio(empty)  # no audio at all: scores of the zero state
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
            ev = await g.events.get()
            toks.append(ev[1])
        s.cancel(g)
        await g.finished.wait()
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
        s.start()
        st = s.open_stream(await s.open_slot())
        s.fail_next_batch = RuntimeError("boom")
        s.push_audio(st, torch.zeros(320))
        with pytest.raises(BatchError, match="boom"):
            await s.end_audio(st)
        late = s.open_stream(await s.open_slot())  # fails while audio is queued, ends later
        s.fail_next_batch = RuntimeError("boom again")
        s.push_audio(late, torch.zeros(320))
        await late.progress.wait()
        with pytest.raises(BatchError, match="boom again"):
            await s.end_audio(late)
        other = s.open_stream(await s.open_slot())
        s.push_audio(other, torch.zeros(320))
        assert (await s.end_audio(other)).shape == (10,)
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
