"""The prefix-state cache through the scheduler: property-based prompts sharing random prefixes,
each served by a scheduler with the cache on and one with it off (separate engines of the same
model). The cache must not change results: the same prompt logits (float32 tolerance), the same
greedy and seeded tokens, the same logprobs and top alternatives, while prompts after the first
are served partly from the cache."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, SamplingParams
from dlr_runtime.engine.logit_processors import LogitParams
from dlr_runtime.engine.prefix_cache import PrefixCache
from dlr_runtime.engine.token_choice import ChoiceRow
from server.events import Done, Token
from server.metrics import Metrics
from server.scheduler import Scheduler
from server.work import TextSession
from tests.conftest import LM_NAME

TOL = 1e-4  # float32: a cached state was computed with another piece segmentation
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def engines(models_dir):
    def one() -> Engine:
        rec = load_recurrent(models_dir / LM_NAME)
        return Engine(make_backend(rec, "torch"), LM_NAME, 8, metadata=rec.checkpoint_metadata)

    return one(), one()  # cache on, cache off


async def serve(
    sched: Scheduler, prompt: list[int], bounds: list[int], params: SamplingParams
) -> tuple[int, torch.Tensor, list[Token]]:
    """One request the way `open_choices` runs it: prefill through the cache (message ends as
    insert points), then a generation with logprobs; (cached tokens, prompt logits, tokens)."""
    sess = TextSession(slot=await sched.open_slot(), pending=[])
    try:
        cached = await asyncio.wait_for(sched.prefill_prompt(sess, prompt, bounds), TIMEOUT_S)
        logits = sess.last_logits.clone()
        row = ChoiceRow.new(params, LogitParams(logprobs=True, top_logprobs=3), 258, "cpu")
        g = sched.generate(sess, params, choice=row)
        toks: list[Token] = []
        while True:
            ev = await asyncio.wait_for(g.events.get(), TIMEOUT_S)
            if not isinstance(ev, Token):
                assert isinstance(ev, Done), ev
                return cached, logits, toks
            toks.append(ev)
    finally:
        await sched.close_slot(sess.slot)


cases = st.tuples(
    st.sampled_from([2, 1000]),  # cache size in states: 2 evicts on nearly every insert
    st.lists(st.integers(0, 255), min_size=0, max_size=400),  # shared prefix (> one 256 piece)
    st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=40), min_size=1, max_size=3),
    st.lists(st.integers(1, 80), max_size=3),  # extra insert points (message ends)
    st.one_of(st.none(), st.integers(0, 2**31)),  # None: greedy, else the seed
)


@given(cases)
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_cache_on_and_off_give_identical_results(engines, case):
    n_states, shared, tails, extra, seed = case
    on_eng, off_eng = engines
    cache = PrefixCache(n_states * (on_eng.state_bytes_per_session() + 258 * 4 + 4096))
    prompts = [[256, *shared, *t] for t in tails] + [[256, *shared, *tails[0]]]  # a repeat too

    async def main() -> None:
        on = Scheduler(
            on_eng,
            Metrics(),
            max_batch_size=8,
            max_batch_wait_s=0.001,
            max_prefill_tokens=256,
            prefix_cache=cache,
        )
        off = Scheduler(
            off_eng, Metrics(), max_batch_size=8, max_batch_wait_s=0.001, max_prefill_tokens=256
        )
        on.start()
        off.start()
        try:
            for i, p in enumerate(prompts):
                bounds = [1 + len(shared), *(b for b in extra if b < len(p))]
                if seed is None:
                    params = SamplingParams(temperature=0, max_tokens=8)
                else:
                    params = SamplingParams(temperature=0.9, seed=seed + i, max_tokens=8)
                (c_on, l_on, t_on), (c_off, l_off, t_off) = await asyncio.gather(
                    serve(on, p, bounds, params), serve(off, p, bounds, params)
                )
                assert c_off == 0
                assert torch.allclose(l_on, l_off, atol=TOL), i
                assert [t.id for t in t_on] == [t.id for t in t_off], i
                for a, b in zip(t_on, t_off, strict=True):
                    assert math.isclose(a.logprob, b.logprob, abs_tol=TOL)
                    assert [k for k, _ in a.top] == [k for k, _ in b.top]
                    assert all(
                        math.isclose(x, y, abs_tol=TOL)
                        for (_, x), (_, y) in zip(a.top, b.top, strict=True)
                    )
                if n_states > 2 and i == len(prompts) - 1:
                    assert c_on == len(p)  # the repeated prompt ran no prefill
                elif n_states > 2 and i > 0:
                    assert c_on >= 1 + len(shared)  # the shared part was never re-run
                assert cache.stats().bytes <= cache.max_bytes
        finally:
            await on.stop()
            await off.stop()

    asyncio.run(main())
