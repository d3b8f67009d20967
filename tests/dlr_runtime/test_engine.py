"""Engine tests: state pool, batched prefill/decode/audio equal to solo runs, no state leakage."""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, PoolFullError, SlotError, split_lengths
from tests.conftest import LM_NAME, SPEECH_NAME

TOL = 1e-5  # float32 state: batched matmuls may round differently from single-row ones


@pytest.fixture(scope="module")
def lm(models_dir):
    rec = load_recurrent(models_dir / LM_NAME)
    eng = Engine(make_backend(rec, "torch"), LM_NAME, 8, metadata=rec.checkpoint_metadata)
    return rec, eng


@pytest.fixture(scope="module")
def speech(models_dir):
    rec = load_recurrent(models_dir / SPEECH_NAME)
    return rec, Engine(make_backend(rec, "torch"), SPEECH_NAME, max_sessions=8)


def test_split_lengths_covers_and_is_canonical():
    for n in range(0, 700, 7):
        parts = split_lengths(n, 256)
        assert sum(parts) == n
        assert all(p == 256 or (p & (p - 1) == 0 and p < 256) for p in parts)
    assert split_lengths(300, 256) == [256, 32, 8, 4]


def test_prefill_batched_equals_solo_and_full_forward(lm):
    rec, eng = lm
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 5, 37, 300, 64)]
    slots = [eng.open() for _ in prompts]
    batched = eng.prefill(slots, prompts)  # (B, V)
    for s in slots:
        eng.close(s)
    for i, p in enumerate(prompts):
        s = eng.open()
        solo = eng.prefill([s], [p])[0]
        eng.close(s)
        assert torch.allclose(batched[i], solo, atol=TOL), i
        # and both equal the plain recurrent chunk over the whole prompt from zero state
        y, _ = rec.chunk(torch.tensor([p]), rec.init_state(1))
        assert torch.allclose(batched[i], y[0, -1], atol=1e-4)


def test_decode_after_prefill_matches_one_long_prefill(lm):
    rec, eng = lm
    toks = list(b"hello world, recurrent state")
    a, b = eng.open(), eng.open()
    eng.prefill([a], [toks[:10]])
    for t in toks[10:]:
        la = eng.decode([a], [t])[0]
    lb_full = eng.prefill([b], [toks])[0]
    assert torch.allclose(la, lb_full, atol=1e-4)
    eng.close(a)
    eng.close(b)


def test_freed_slot_is_zeroed_no_leak(lm):
    _, eng = lm
    s = eng.open()
    fresh = eng.prefill([s], [[65, 66, 67]])[0]
    eng.close(s)
    s2 = eng.open()
    assert s2 == s  # lowest free slot is reused
    eng.prefill([s2], [list(b"some long unrelated history " * 5)])
    eng.close(s2)
    s3 = eng.open()
    assert s3 == s
    assert all(bool((v[s3] == 0).all()) for v in eng.pool.state.values())
    again = eng.prefill([s3], [[65, 66, 67]])[0]
    assert torch.equal(fresh, again)
    eng.close(s3)


def test_pool_limits_and_bad_slots(lm):
    _, eng = lm
    slots = [eng.open() for _ in range(eng.pool.max_sessions)]
    with pytest.raises(PoolFullError):
        eng.open()
    eng.close(slots[3])
    with pytest.raises(SlotError):
        eng.decode([slots[3]], [1])
    with pytest.raises(SlotError):
        eng.close(slots[3])
    with pytest.raises(SlotError):
        eng.decode([slots[0], slots[0]], [1, 2])
    with pytest.raises(ValueError, match="token ids"):
        eng.decode([slots[0]], [999])
    with pytest.raises(ValueError, match="at least one token"):
        eng.prefill([slots[0]], [[]])
    with pytest.raises(TypeError, match="lm model"):
        eng.feed_audio([slots[0]], [torch.zeros(160)])
    for s in slots:
        if s != slots[3]:
            eng.close(s)
    assert eng.pool.in_use == 0


def test_audio_batched_groups_equal_solo(speech):
    rec, eng = speech
    g = torch.Generator().manual_seed(1)
    clips = [torch.randn(n, generator=g) * 0.3 for n in (1600, 3200, 4000, 1234)]
    slots = [eng.open() for _ in clips]
    # feed in rounds of unequal chunk lengths (some rows share a call, some do not)
    sizes = [[320, 960, 320], [320, 1280, 1600], [1600, 2400], [100, 1134]]
    outs = [[] for _ in clips]
    pos = [0] * len(clips)
    for r in range(3):
        rows = [i for i in range(len(clips)) if r < len(sizes[i])]
        chunks = [clips[i][pos[i] : pos[i] + sizes[i][r]] for i in rows]
        ys = eng.feed_audio([slots[i] for i in rows], chunks)
        for i, y in zip(rows, ys, strict=True):
            outs[i].append(y)
            pos[i] += sizes[i][r]
    final = eng.scores(slots)
    for i, clip in enumerate(clips):
        y_ref, st = rec.chunk(clip.unsqueeze(0), rec.init_state(1))  # solo, one call
        y = torch.cat(outs[i])
        assert y.shape == y_ref[0].shape == (clip.numel() // 160, 10)
        assert torch.allclose(y, y_ref[0], atol=TOL)
        assert torch.allclose(final[i], rec.scores(st)[0], atol=TOL)
        assert eng.frames_done(slots[i]) == clip.numel() // 160
        assert eng.pending_in_frame(slots[i]) == clip.numel() % 160
    for s in slots:
        eng.close(s)


def test_audio_rejects_non_finite(speech):
    _, eng = speech
    s = eng.open()
    x = torch.zeros(320)
    x[5] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        eng.feed_audio([s], [x])
    eng.close(s)
