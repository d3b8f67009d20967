"""Logit processors: batched penalties, logit_bias and logprobs against plain per-row
references; a batched decode loop with mixed options equals each row run alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, SamplingParams, sample_token
from dlr_runtime.engine.logit_processors import (
    LogitParams,
    TokenCounts,
    bias_rows,
    logprobs,
    logprobs_ref,
    process,
    process_ref,
)
from dlr_runtime.engine.prompt_logprobs import prefill_all_logits, prompt_token_logprobs
from dlr_runtime.engine.token_choice import ChoiceRow, Chosen, choose_tokens
from tests.conftest import LM_NAME

V = 12
penalty = st.floats(-2, 2, allow_nan=False)
row = st.tuples(
    st.lists(st.floats(-20, 20, allow_nan=False), min_size=V, max_size=V),  # logits
    penalty,
    penalty,
    st.dictionaries(st.integers(0, V - 1), st.floats(-100, 100, allow_nan=False), max_size=4),
    st.lists(st.integers(0, V - 1), max_size=15),  # generated so far
)


@given(st.lists(row, min_size=1, max_size=5))
@settings(max_examples=200, deadline=None)
def test_batched_process_equals_reference_per_row(rows):
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        params, counts, logits = [], [], []
        for lg, pres, freq, bias, gen in rows:
            params.append(
                LogitParams(presence_penalty=pres, frequency_penalty=freq, logit_bias=bias)
            )
            c = TokenCounts(V)
            for t in gen:
                c.add(t)
            counts.append(c)
            logits.append(lg)
        out = process(torch.tensor(logits, dtype=dtype), params, counts)  # (B, V)
        assert out.dtype == dtype
        for i, (lg, _, _, _, gen) in enumerate(rows):
            ref = torch.tensor(process_ref(lg, params[i], gen), dtype=torch.float64)
            assert torch.allclose(out[i].double(), ref, atol=tol, rtol=0), i


def test_process_is_identity_without_options():
    x = torch.randn(3, V)
    out = process(x, [LogitParams()] * 3, [TokenCounts(V) for _ in range(3)])
    assert out is x


def test_penalty_example_by_hand():
    c = TokenCounts(4)
    for t in (1, 1, 2):
        c.add(t)
    p = LogitParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = process(torch.zeros(1, 4), [p], [c])[0]
    assert out.tolist() == [0.0, -1.0, -0.75, 0.0]


def test_bias_bans_a_token_under_greedy():
    x = torch.tensor([[0.0, 5.0, 1.0]])
    out = process(x, [LogitParams(logit_bias={1: -100.0})], [TokenCounts(3)])
    assert int(out.argmax()) == 2
    with pytest.raises(ValueError, match="not in"):
        bias_rows([{7: 1.0}], 3)


@given(
    st.lists(
        st.lists(st.floats(-30, 30, allow_nan=False), min_size=V, max_size=V),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, V),
    st.data(),
)
@settings(max_examples=200, deadline=None)
def test_logprobs_equal_reference(rows, k, data):
    chosen = [data.draw(st.integers(0, V - 1)) for _ in rows]
    res = logprobs(torch.tensor(rows, dtype=torch.float32), torch.tensor(chosen), k)
    assert res.top_ids.shape == (len(rows), k) and res.top_logprobs.shape == (len(rows), k)
    for i, lg in enumerate(rows):
        want, top = logprobs_ref(lg, chosen[i], k)
        assert abs(res.chosen[i].item() - want) < 1e-4
        # top values equal the reference's (ids may differ only between exact ties)
        assert torch.allclose(
            res.top_logprobs[i].double(),
            torch.tensor([v for _, v in top], dtype=torch.float64),
            atol=1e-4,
        )
        for j, v in zip(res.top_ids[i].tolist(), res.top_logprobs[i].tolist(), strict=True):
            assert abs(logprobs_ref(lg, j, 0)[0] - v) < 1e-4


def test_logprobs_sum_to_one_and_top_is_sorted():
    x = torch.randn(2, 258)
    res = logprobs(x, torch.tensor([0, 5]), 20)
    assert torch.allclose(torch.log_softmax(x, -1).exp().sum(-1), torch.ones(2))
    assert torch.all(res.top_logprobs[:, :-1] >= res.top_logprobs[:, 1:])
    assert torch.equal(res.top_ids[:, 0], x.argmax(-1))


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"logit_bias": {1: 101.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_params_refuse_out_of_range(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        LogitParams(**kwargs)


# ------------------------------------------------------------------ a decode loop with options
@pytest.fixture(scope="module")
def engine(models_dir):
    rec = load_recurrent(models_dir / LM_NAME)
    return Engine(make_backend(rec, "torch"), LM_NAME, 8, metadata=rec.checkpoint_metadata)


OPTIONS = [
    (SamplingParams(temperature=0, max_tokens=20), LogitParams()),
    (SamplingParams(seed=3, max_tokens=20), LogitParams()),
    (
        SamplingParams(temperature=0, max_tokens=20),
        LogitParams(presence_penalty=1.5, frequency_penalty=0.7, logprobs=True, top_logprobs=3),
    ),
    (SamplingParams(seed=9, max_tokens=20), LogitParams(logit_bias={101: 5.0, 32: -100.0})),
    (SamplingParams(seed=4, temperature=0.7, top_k=20, max_tokens=20), LogitParams(logprobs=True)),
]


def _reference_run(engine, prompt, sp, lparams):
    """One row alone: process_ref / logprobs_ref in float64 and sample_token, step by step."""
    s = engine.open()
    try:
        logits, gen, out, gen_tokens = engine.prefill([s], [prompt])[0], sp.generator(), [], []
        for _ in range(sp.max_tokens):
            ref = torch.tensor(
                process_ref(logits.tolist(), lparams, gen_tokens), dtype=torch.float64
            )
            tok = sample_token(ref, sp, gen)
            lp = logprobs_ref(ref.tolist(), tok, lparams.top_logprobs) if lparams.logprobs else None
            out.append((tok, lp))
            gen_tokens.append(tok)
            logits = engine.decode([s], [tok])[0]
        return out
    finally:
        engine.close(s)


def test_batched_choose_tokens_equals_per_row_reference(engine):
    prompt = [256, *b"The quality of mercy"]
    slots = [engine.open() for _ in OPTIONS]
    rows = [ChoiceRow.new(sp, lp, 258, "cpu") for sp, lp in OPTIONS]
    got: list[list[Chosen]] = [[] for _ in OPTIONS]
    try:
        logits = engine.prefill(slots, [prompt] * len(slots))  # (B, V)
        for _ in range(20):
            chosen = choose_tokens(logits, rows)
            for i, c in enumerate(chosen):
                got[i].append(c)
            logits = engine.decode(slots, [c.token for c in chosen])
    finally:
        for s in slots:
            engine.close(s)
    for i, (sp, lp) in enumerate(OPTIONS):
        ref = _reference_run(engine, prompt, sp, lp)
        assert [c.token for c in got[i]] == [t for t, _ in ref], i
        for c, (_, r) in zip(got[i], ref, strict=True):
            if r is None:
                assert c.logprob is None and c.top == []
            else:
                assert abs(c.logprob - r[0]) < 1e-4 and len(c.top) == lp.top_logprobs
                assert all(abs(a[1] - b[1]) < 1e-4 for a, b in zip(c.top, r[1], strict=True))
    assert 32 not in [c.token for c in got[3]]  # banned by logit_bias
    assert [c.token for c in got[2]] != [c.token for c in got[0]]  # penalties change greedy


def test_prompt_logprobs_equal_prefix_prefills(engine):
    g = torch.Generator().manual_seed(1)
    prompt = [256, *torch.randint(0, 256, (300,), generator=g).tolist()]
    s = engine.open()
    try:
        every = prefill_all_logits(engine, s, prompt)  # (T, V)
        after = engine.decode([s], [65])[0]
    finally:
        engine.close(s)
    assert every.shape == (len(prompt), 258)
    s = engine.open()
    try:
        assert torch.allclose(every[-1], engine.prefill([s], [prompt])[0], atol=1e-5)
        assert torch.allclose(after, engine.decode([s], [65])[0], atol=1e-5)  # same end state
    finally:
        engine.close(s)
    for n in (1, 2, 77, 256, 257):  # logits after position n-1 = a cold prefill of prompt[:n]
        s = engine.open()
        try:
            assert torch.allclose(every[n - 1], engine.prefill([s], [prompt[:n]])[0], atol=1e-4)
        finally:
            engine.close(s)
    lp = prompt_token_logprobs(every, prompt, 3)
    assert lp.chosen.shape == (len(prompt) - 1,) and lp.top_ids.shape == (len(prompt) - 1, 3)
    want, _ = logprobs_ref(every[9].double().tolist(), prompt[10], 0)
    assert abs(lp.chosen[9].item() - want) < 1e-4
