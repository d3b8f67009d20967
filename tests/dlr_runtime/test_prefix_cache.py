"""Prefix-state cache: radix-tree lookups, byte bound and eviction, pinning, stats; prefill
through the cache equals a cold prefill (property-based over prompts sharing random prefixes);
forks copy state exactly."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, PoolFullError, SamplingParams, sample_token
from dlr_runtime.engine.cached_prefill import (
    pin_prefix,
    plan_prefill,
    prefill_cached,
    prefill_n,
)
from dlr_runtime.engine.prefix_cache import (
    KEY_BYTES_PER_TOKEN,
    PrefixCache,
    PrefixCacheFull,
    max_bytes_from_env,
)
from dlr_runtime.engine.slot_state import copy_state, export_state, fork, import_state
from tests.conftest import LM_NAME

TOL = 1e-4  # float32 logits: a cached state was computed with another piece segmentation
BYTE_LM = Path(__file__).resolve().parents[2] / "models" / "byte-lm"


def _state(v: float, n: int = 4) -> dict[str, torch.Tensor]:
    return {"ssm": torch.full((n,), v, dtype=torch.complex64)}  # 8 bytes per element


def _entry_bytes(n: int = 4) -> int:
    return 8 * n


# ------------------------------------------------------------------ the tree alone
def test_lookup_returns_longest_cached_prefix_at_any_token():
    c = PrefixCache(1 << 20)
    c.insert([1, 2, 3], _state(3))
    c.insert([1, 2, 3, 4, 5], _state(5))
    c.insert([1, 2], _state(2))
    c.insert([1, 9], _state(9))
    assert c.lookup([7, 1, 2]).length == 0
    assert c.lookup([1]).length == 0
    hit = c.lookup([1, 2, 3, 4])
    assert hit.length == 3 and hit.state["ssm"][0].real == 3
    assert c.lookup([1, 2, 3, 4, 5, 6]).length == 5
    assert c.lookup([1, 2, 3, 4, 5]).length == 5
    assert c.lookup([1, 2, 7]).length == 2
    assert c.lookup([1, 9, 9]).state["ssm"][0].real == 9
    assert c.lookup([1, 2, 3, 4, 5], max_len=4).length == 3
    assert c.contains([1, 2, 3]) and not c.contains([1, 2, 3, 4])


def test_states_are_copied_on_insert_and_lookup():
    c = PrefixCache(1 << 20)
    live = _state(1.0)
    c.insert([5, 6], live)
    live["ssm"].fill_(7.0)  # the slot moves on
    hit = c.lookup([5, 6])
    assert torch.all(hit.state["ssm"] == 1.0)
    hit.state["ssm"].fill_(3.0)  # the borrower writes into its copy
    assert torch.all(c.lookup([5, 6]).state["ssm"] == 1.0)


def test_byte_bound_lru_eviction_and_accounting():
    per = _entry_bytes()
    # room for three entries with 2-token keys that share nothing
    c = PrefixCache(3 * (per + 2 * KEY_BYTES_PER_TOKEN))
    for k in range(3):
        assert c.insert([k, 100], _state(k))
    assert len(c) == 3 and c.stats().bytes == c.max_bytes
    c.lookup([0, 100])  # 0 becomes most recent; 1 is now the oldest
    assert c.insert([3, 100], _state(3))
    s = c.stats()
    assert s.evictions == 1 and s.entries == 3 and s.bytes <= c.max_bytes
    assert not c.contains([1, 100]) and c.contains([0, 100]) and c.contains([3, 100])
    # an entry larger than the whole cache is rejected, not stored
    assert not c.insert([9] * 1000, _state(1))
    assert c.stats().rejected == 1 and len(c) == 3


def test_eviction_prunes_tree_and_frees_key_bytes():
    c = PrefixCache(1 << 20)
    c.insert(list(range(50)), _state(1))
    c.insert(list(range(40)) + [7] * 10, _state(2))  # splits the edge at 40
    full = c.stats().bytes
    assert full == 2 * _entry_bytes() + 60 * KEY_BYTES_PER_TOKEN
    assert c.remove(list(range(50)))
    assert c.stats().bytes == _entry_bytes() + 50 * KEY_BYTES_PER_TOKEN
    assert c.lookup(list(range(40)) + [7] * 10).length == 50
    assert c.remove(list(range(40)) + [7] * 10)
    assert c.stats().bytes == 0 and len(c) == 0 and not c._root.children


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=40))
@settings(max_examples=150, deadline=None)
def test_tree_matches_a_dict_model_under_random_inserts_and_bound(keys):
    """Every held entry is found exactly; lookups equal a brute-force longest-prefix search over
    held entries; accounted bytes equal a recount and never exceed the bound."""
    c = PrefixCache(5 * (_entry_bytes() + 4 * KEY_BYTES_PER_TOKEN))
    for i, k in enumerate(keys):
        c.insert(k, _state(float(i)))
        held = {}
        stack = [(c._root, ())]
        edge_tokens = 0
        while stack:
            node, path = stack.pop()
            path = path + node.edge
            edge_tokens += len(node.edge)
            if node.state is not None:
                held[path] = node.state["ssm"][0].real.item()
            stack.extend((ch, path) for ch in node.children.values())
        s = c.stats()
        assert s.bytes == len(held) * _entry_bytes() + edge_tokens * KEY_BYTES_PER_TOKEN
        assert s.bytes <= c.max_bytes and s.entries == len(held)
        for q in keys[: i + 1]:
            best = max((len(h) for h in held if tuple(q[: len(h)]) == h), default=0)
            assert c.lookup(q).length == best


def test_pinned_entries_are_never_evicted():
    per = _entry_bytes() + 2 * KEY_BYTES_PER_TOKEN
    c = PrefixCache(3 * per)
    assert c.insert([0, 0], _state(0), pin=True)
    for k in range(1, 20):
        c.insert([k, 0], _state(k))
    assert c.contains([0, 0]) and c.stats().pinned == 1 and len(c) == 3
    c.insert([50, 0], _state(1), pin=True)
    c.insert([51, 0], _state(1), pin=True)
    with pytest.raises(PrefixCacheFull):
        c.insert([52, 0], _state(1), pin=True)
    assert not c.insert([53, 0], _state(1))  # only pinned entries left: no room
    assert c.unpin([50, 0]) and not c.unpin([50, 0])
    assert c.insert([53, 0], _state(1)) and not c.contains([50, 0])


def test_stats_count_lookups_hits_and_tokens():
    c = PrefixCache(1 << 20)
    c.insert([1, 2, 3], _state(1))
    c.lookup([1, 2, 3, 4])  # hit 3 of 4
    c.lookup([2, 2])  # miss
    s = c.stats()
    assert (s.lookups, s.hits, s.hit_tokens, s.lookup_tokens) == (2, 1, 3, 6)
    assert s.hit_rate == 0.5 and s.token_hit_rate == 0.5 and s.inserts == 1
    m = s.as_metrics()
    assert m["prefix_cache_hit_tokens_total"] == 3 and m["prefix_cache_bytes"] == s.bytes > 0


def test_concurrent_inserts_and_lookups_keep_the_tree_consistent():
    c = PrefixCache(40 * (_entry_bytes() + 6 * KEY_BYTES_PER_TOKEN))
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(300):
                k = torch.randint(0, 3, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g)
                if torch.rand(1, generator=g) < 0.5:
                    c.insert(k.tolist(), _state(1.0))
                else:
                    c.lookup(k.tolist())
                c.stats()
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert c.stats().bytes <= c.max_bytes


def test_max_bytes_from_env(monkeypatch):
    monkeypatch.setenv("DLR_PREFIX_CACHE_MB", "1.5")
    assert max_bytes_from_env() == 1572864
    monkeypatch.setenv("DLR_PREFIX_CACHE_MB", "-1")
    with pytest.raises(ValueError, match="DLR_PREFIX_CACHE_MB"):
        max_bytes_from_env()


# ------------------------------------------------------------------ with the engine
@pytest.fixture(scope="module")
def engine(models_dir):
    rec = load_recurrent(models_dir / LM_NAME)
    return Engine(make_backend(rec, "torch"), LM_NAME, 8, metadata=rec.checkpoint_metadata)


def _cold(eng: Engine, tokens: list[int]) -> torch.Tensor:
    s = eng.open()
    try:
        return eng.prefill([s], [tokens])[0]
    finally:
        eng.close(s)


def _generate(eng: Engine, slot: int, logits: torch.Tensor, params: SamplingParams) -> list[int]:
    gen, out = params.generator(), []
    for _ in range(params.max_tokens):
        t = sample_token(logits, params, gen)
        out.append(t)
        logits = eng.decode([slot], [t])[0]
    return out


prompts_sharing_prefixes = st.tuples(
    st.sampled_from([2, 1000]),  # cache size in states: 2 evicts on nearly every insert
    st.lists(st.integers(0, 255), min_size=0, max_size=300),  # shared prefix
    st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=40), min_size=1, max_size=4),
    st.lists(st.integers(1, 60), max_size=3),  # extra boundaries (message ends)
)


@given(prompts_sharing_prefixes)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_cached_prefill_equals_cold_prefill(engine, case):
    n_states, shared, tails, bounds = case
    cache = PrefixCache(n_states * (engine.state_bytes_per_session() + 258 * 4 + 4096))
    prompts = [[256, *shared, *t] for t in tails] + [[256, *shared, *tails[0]]]  # a repeat too
    for i, p in enumerate(prompts):
        s = engine.open()
        try:
            marks = [1 + len(shared), *(b for b in bounds if b < len(p))]  # e.g. message ends
            res = prefill_cached(engine, cache, [s], [p], [marks])
            cold = _cold(engine, p)
            assert torch.allclose(res.logits[0], cold, atol=TOL), i
            assert res.cached_tokens[0] + res.prefilled_tokens[0] == len(p)
            if n_states > 2 and i == len(prompts) - 1:
                assert res.cached_tokens[0] == len(p)  # a repeated prompt runs no prefill
            elif n_states > 2 and i > 0:
                assert res.cached_tokens[0] >= 1 + len(shared)  # the shared part is never re-run
            assert cache.stats().bytes <= cache.max_bytes
        finally:
            engine.close(s)


def test_sibling_prompts_hit_at_their_branch_point_without_boundaries(engine):
    shared = [256, *b"A long shared document that several requests continue. " * 3]
    cache = PrefixCache(64 << 20)
    got = []
    for tail in (b"First question?", b"Second one?", b"Third!"):
        p = shared + list(tail)
        s = engine.open()
        try:
            res = prefill_cached(engine, cache, [s], [p])
            assert torch.allclose(res.logits[0], _cold(engine, p), atol=TOL)
            got.append(res.cached_tokens[0])
        finally:
            engine.close(s)
    assert got == [0, 0, len(shared)]  # the 2nd stored the branch point, the 3rd hit it
    assert cache.shared_length(shared + [1]) == len(shared) and len(cache) == 4


def test_plan_drives_a_chunked_prefill_like_a_scheduler(engine):
    """Pieces of a token budget that never cross an insert point; states land at the message
    boundaries; the logits equal a cold prefill, and a second conversation hits the first's."""
    cache = PrefixCache(64 << 20)
    msgs = [b"System: be brief.\n", b"User: hello there\n", b"Assistant: "]
    tokens, bounds = [256], []
    for m in msgs:
        tokens += list(m)
        bounds.append(len(tokens))
    for k, budget in enumerate((7, 64)):
        s = engine.open()
        try:
            plan = plan_prefill(engine, cache, s, tokens, bounds[:-1])
            pos = plan.cached
            while pos < len(tokens):
                end = plan.next_end(pos, budget)
                assert end - pos <= budget and not any(pos < b < end for b in plan.points)
                logits = engine.prefill([s], [tokens[pos:end]])[0]
                plan.reached(engine, s, end, logits)
                pos = end
            assert torch.allclose(plan.logits, _cold(engine, tokens), atol=TOL)
        finally:
            engine.close(s)
        if k == 0:
            assert plan.cached == 0 and all(cache.contains(tokens[:b]) for b in bounds)
        else:
            assert plan.cached == len(tokens)  # the whole prompt came from the cache
    other = tokens[: bounds[0]] + list(b"User: another\n")
    s = engine.open()
    try:
        assert plan_prefill(engine, cache, s, other).cached == bounds[0]
    finally:
        engine.close(s)


def test_cached_prefill_gives_identical_greedy_and_seeded_tokens(engine):
    g = torch.Generator().manual_seed(3)
    system = [256, *torch.randint(0, 256, (200,), generator=g).tolist()]
    cache = PrefixCache(64 << 20)
    for k, params in enumerate(
        [SamplingParams(temperature=0, max_tokens=24), SamplingParams(seed=11, max_tokens=24)]
    ):
        user = torch.randint(0, 256, (30 + k,), generator=g).tolist()
        outs = []
        for use_cache in (False, True, True):
            s = engine.open()
            try:
                res = prefill_cached(
                    engine, cache if use_cache else None, [s], [system + user], [[len(system)]]
                )
                outs.append(_generate(engine, s, res.logits[0], params))
            finally:
                engine.close(s)
        assert outs[0] == outs[1] == outs[2], params


def test_batched_cached_prefill_equals_cold_rows(engine):
    g = torch.Generator().manual_seed(4)
    base = [256, *torch.randint(0, 256, (100,), generator=g).tolist()]
    cache = PrefixCache(64 << 20)
    pin_prefix(engine, cache, base[:60])
    prompts = [base + torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 7, 33)]
    prompts.append([256, 1, 2, 3])
    slots = [engine.open() for _ in prompts]
    try:
        res = prefill_cached(engine, cache, slots, prompts)
    finally:
        for s in slots:
            engine.close(s)
    assert res.cached_tokens == [60, 60, 60, 0]
    for i, p in enumerate(prompts):
        assert torch.allclose(res.logits[i], _cold(engine, p), atol=TOL)
    assert cache.stats().pinned == 1


def test_fork_copies_state_exactly_and_measures_cost(engine):
    a = engine.open()
    engine.prefill([a], [[256, *b"fork me"]])
    before = export_state(engine, a)
    f = fork(engine, a, 3)
    try:
        assert len(f.slots) == 3 and a not in f.slots
        assert f.bytes_copied == 3 * engine.state_bytes_per_session() and f.seconds >= 0
        rows = [export_state(engine, s) for s in f.slots]
        for r in rows:
            assert torch.equal(r["ssm"], before["ssm"])
        # the branches diverge independently
        ya = engine.decode([a, *f.slots], [1, 1, 2, 2])
        assert torch.equal(ya[0], ya[1]) and not torch.equal(ya[1], ya[2])
    finally:
        for s in [a, *f.slots]:
            engine.close(s)


def test_copy_state_into_an_owned_slot_equals_the_source(engine):
    a, b = engine.open(), engine.open()
    try:
        engine.prefill([a], [[256, *b"copy me"]])
        engine.prefill([b], [[256, *b"something else entirely"]])
        assert copy_state(engine, a, b) == engine.state_bytes_per_session()
        sa, sb = export_state(engine, a), export_state(engine, b)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        y = engine.decode([a, b], [5, 5])  # (2, V): the copy continues exactly as the source
        assert torch.equal(y[0], y[1])
    finally:
        engine.close(a)
        engine.close(b)


def test_prefill_n_forks_one_prefill_into_n_seeded_choices(engine):
    prompt = [256, *b"Once upon a time"]
    cache = PrefixCache(64 << 20)
    res = prefill_n(engine, cache, prompt, 3)
    try:
        assert len(set(res.slots)) == 3 and res.fork.bytes_copied > 0
        assert torch.allclose(res.logits, _cold(engine, prompt), atol=TOL)
        outs = []
        for i, s in enumerate(res.slots):
            outs.append(_generate(engine, s, res.logits, SamplingParams(seed=5 + i, max_tokens=12)))
    finally:
        for s in res.slots:
            engine.close(s)
    for i in range(3):  # each choice equals a cold run of its own with its seed
        s = engine.open()
        try:
            logits = engine.prefill([s], [prompt])[0]
            assert (
                _generate(engine, s, logits, SamplingParams(seed=5 + i, max_tokens=12)) == outs[i]
            )
        finally:
            engine.close(s)


def test_fork_is_all_or_nothing_when_the_pool_is_full(engine):
    a = engine.open()
    free = engine.pool.available
    with pytest.raises(PoolFullError):
        fork(engine, a, free + 1)
    assert engine.pool.available == free
    engine.close(a)


def test_import_state_checks_layout(engine):
    s = engine.open()
    try:
        row = export_state(engine, s)
        with pytest.raises(ValueError, match="ssm"):
            import_state(engine, s, {"ssm": row["ssm"][:1]})
        import_state(engine, s, row)
    finally:
        engine.close(s)


@pytest.mark.skipif(not BYTE_LM.exists(), reason="shipped byte LM not present")
def test_shipped_byte_lm_cached_equals_cold():
    torch.set_num_threads(1)
    rec = load_recurrent(BYTE_LM)
    eng = Engine(make_backend(rec, "torch"), "byte-lm", 2, metadata=rec.checkpoint_metadata)
    system = [256, *b"System: You are a helpful assistant who answers briefly.\n"]
    cache = PrefixCache(16 << 20)
    params = SamplingParams(temperature=0, max_tokens=16)
    for q in (b"User: Who is Portia?\nAssistant:", b"User: Who is Shylock?\nAssistant:"):
        p = system + list(q)
        outs = []
        for c in (None, cache):
            s = eng.open()
            try:
                res = prefill_cached(eng, c, [s], [p], [[len(system)]])
                assert torch.allclose(res.logits[0], _cold(eng, p), atol=TOL)
                outs.append(_generate(eng, s, res.logits[0], params))
            finally:
                eng.close(s)
        assert outs[0] == outs[1]
    assert cache.stats().hits >= 1 and cache.stats().hit_tokens >= len(system)


@pytest.mark.slow
@pytest.mark.skipif(not BYTE_LM.exists(), reason="shipped byte LM not present")
def test_shipped_byte_lm_long_prefix_hit_matches_cold():
    """A hit after 8K tokens of real text: logits equal a cold prefill to float32 tolerance
    (measured ~2e-6 at 1K-32K tokens; the segmentation differs, the state stays exact)."""
    torch.set_num_threads(1)
    rec = load_recurrent(BYTE_LM)
    eng = Engine(make_backend(rec, "torch"), "byte-lm", 2, metadata=rec.checkpoint_metadata)
    text = (BYTE_LM / "MODEL.md").read_bytes()
    shared = [256, *(text * (8191 // len(text) + 1))[:8191]]
    cache = PrefixCache(16 << 20)
    s = eng.open()
    prefill_cached(eng, cache, [s], [shared])
    eng.close(s)
    p = shared + list(b" and then a question?")
    s = eng.open()
    try:
        res = prefill_cached(eng, cache, [s], [p])
    finally:
        eng.close(s)
    assert res.cached_tokens == [len(shared)]
    assert torch.allclose(res.logits[0], _cold(eng, p), atol=TOL)
