"""Tests for the synthetic task suite: shapes, masks and an independent check per task."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from training.data.synthetic import (
    TASKS,
    SyntheticConfig,
    in_features,
    input_length,
    make_batch,
    masked_mse,
    out_features,
    score,
)

B = 3
L = 24


def _batch(task: str, seed: int = 0, length: int = L, config: SyntheticConfig | None = None):
    gen = torch.Generator().manual_seed(seed)
    out = make_batch(task, B, length, gen, config)
    return tuple(t.numpy() for t in out)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_shapes_dtypes_and_phase(task: str) -> None:
    cfg = SyntheticConfig()
    inputs, targets, mask = _batch(task)
    steps = input_length(task, L, cfg)
    assert inputs.shape == (B, steps, in_features(task, cfg))
    assert targets.shape == (B, steps, out_features(task, cfg))
    assert mask.shape == (B, steps) and mask.dtype == np.bool_
    assert inputs.dtype == np.float32 and targets.dtype == np.float32
    assert np.isfinite(inputs).all() and np.isfinite(targets).all()
    assert mask.any(axis=1).all()
    assert (targets[~mask] == 0).all()
    phase = 2 * np.pi * np.arange(steps) / steps
    np.testing.assert_allclose(inputs[0, :, -2], np.cos(phase), atol=1e-6)
    np.testing.assert_allclose(inputs[0, :, -1], np.sin(phase), atol=1e-6)
    data = inputs[..., :-2]
    np.testing.assert_allclose(np.abs(data).max(axis=(1, 2)), 1.0, atol=1e-6)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_deterministic_given_generator(task: str) -> None:
    a, b, c = _batch(task, seed=5), _batch(task, seed=5), _batch(task, seed=6)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])


def test_unknown_task() -> None:
    with pytest.raises(KeyError, match="unknown task"):
        make_batch("nope", 1, 4, torch.Generator())


def test_shift() -> None:
    cfg = SyntheticConfig(shift_channels=3)
    inputs, targets, mask = _batch("shift", config=cfg)
    x = inputs[..., 0]
    assert mask.all()
    for k in range(3):
        s = k * L // 3
        for t in range(L):
            expect = x[:, t - s] if t >= s else np.zeros(B)
            np.testing.assert_array_equal(targets[:, t, k], expect)


def test_cumsum_and_cummax() -> None:
    inputs, targets, mask = _batch("cumsum")
    x = inputs[..., 0].astype(np.float64)
    expect = np.cumsum(x, axis=1) / np.sqrt(np.arange(1, L + 1))
    np.testing.assert_allclose(targets[..., 0], expect, atol=1e-5)
    assert mask.all()
    inputs, targets, _ = _batch("cummax")
    np.testing.assert_array_equal(targets[..., 0], np.maximum.accumulate(inputs[..., 0], axis=1))


def test_reverse() -> None:
    inputs, targets, mask = _batch("reverse")
    x = inputs[:, :L, 0]
    assert (inputs[:, L:, 0] == 0).all()
    assert (mask[:, L:]).all() and not mask[:, :L].any()
    np.testing.assert_array_equal(targets[:, L:, 0], x[:, ::-1])


def test_sort() -> None:
    inputs, targets, mask = _batch("sort")
    x = inputs[:, :L, 0]
    assert (inputs[:, L:, 0] == 0).all()
    assert (mask[:, L:]).all() and not mask[:, :L].any()
    out = targets[:, L:, 0]
    for b in range(B):
        np.testing.assert_array_equal(np.sort(out[b]), np.sort(x[b]))  # a permutation of x
        dist = np.abs(out[b] - x[b, 0])
        assert (np.diff(dist) >= 0).all()
        assert out[b, 0] == x[b, 0]


def test_context_shift() -> None:
    inputs, targets, mask = _batch("context_shift", seed=3)
    assert inputs.shape[1] == L + 2
    assert not mask[:, :2].any() and mask[:, 2:].all()
    shifts = set()
    for b in range(B):
        angle = math.atan2(inputs[b, 1, 0], inputs[b, 0, 0]) % (2 * math.pi)
        s = round(angle * L / (2 * math.pi)) % L
        shifts.add(s)
        x = inputs[b, 2:, 0]
        expect = np.array([x[t - s] if t >= s else 0.0 for t in range(L)])
        np.testing.assert_array_equal(targets[b, 2:, 0], expect)
    assert len(shifts) > 1


@pytest.mark.parametrize("task", ["masked_select", "masked_select_fixed"])
def test_masked_select(task: str) -> None:
    m = 5
    cfg = SyntheticConfig(select_count=m)
    inputs, targets, mask = _batch(task, config=cfg)
    assert inputs.shape[1] == L + m
    assert not mask[:, :L].any() and mask[:, L:].all()
    assert (inputs[:, L:, :2] == 0).all()
    positions = []
    for b in range(B):
        marked = np.flatnonzero(inputs[b, :, 1] == 1.0)
        assert len(marked) == m and set(np.unique(inputs[b, :, 1])) <= {0.0, 1.0}
        positions.append(tuple(marked))
        np.testing.assert_array_equal(targets[b, L:, 0], inputs[b, marked, 0])
    if task == "masked_select_fixed":
        other = _batch(task, seed=99, config=cfg)[0]
        assert len(set(positions)) == 1
        assert tuple(np.flatnonzero(other[0, :, 1])) == positions[0]
    else:
        assert len(set(positions)) > 1


@pytest.mark.parametrize("task", ["solve", "solve_fixed"])
def test_solve(task: str) -> None:
    inputs, targets, mask = _batch(task, length=L)
    n = 4  # largest n with n*n + 2n <= 24
    assert inputs.shape[1] == n * n + 2 * n
    assert mask[:, n * n + n :].all() and not mask[:, : n * n + n].any()
    mats = []
    for b in range(B):
        v = inputs[b, :, 0].astype(np.float64)
        a, rhs = v[: n * n].reshape(n, n), v[n * n : n * n + n]
        gram = a @ a.T
        np.testing.assert_allclose(gram, np.eye(n) * gram[0, 0], atol=1e-5)  # c * orthogonal
        np.testing.assert_allclose(targets[b, n * n + n :, 0], np.linalg.solve(a, rhs), atol=1e-4)
        mats.append(a / np.linalg.norm(a))
    same = all(np.allclose(mats[0], a, atol=1e-5) for a in mats)
    assert same == (task == "solve_fixed")


@pytest.mark.parametrize("interleave", [False, True])
def test_mips_brute_force(interleave: bool) -> None:
    cfg = SyntheticConfig(mips_key_dim=3, mips_value_dim=2, mips_interleave=interleave)
    inputs, targets, mask = _batch("mips", seed=1, config=cfg)
    d, dv = 3, 2
    keys, vals, queries = inputs[..., :d], inputs[..., d : d + dv], inputs[..., d + dv : -2]
    assert mask.sum(axis=1).tolist() == [L // 2] * B
    for b in range(B):
        seen: list[int] = []
        for t in range(L):
            if mask[b, t]:
                assert (keys[b, t] == 0).all() and (vals[b, t] == 0).all()
                best = max(seen, key=lambda s, b=b, t=t: float(keys[b, s] @ queries[b, t]))
                np.testing.assert_array_equal(targets[b, t], vals[b, best])
            else:
                assert (queries[b, t] == 0).all()
                seen.append(t)
    assert not mask[:, 0].any()
    keys_then_queries = (np.diff(mask.astype(int), axis=1) >= 0).all(axis=1)
    if interleave:
        assert not keys_then_queries.all()
    else:
        assert keys_then_queries.all() and mask[:, L // 2 :].all()


def test_score_and_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    batch = make_batch("cumsum", 4, 32, gen)
    assert score(batch.targets, batch.targets, batch.mask) == 1.0
    mean = batch.targets[batch.mask].mean()
    assert score(torch.full_like(batch.targets, float(mean)), batch.targets, batch.mask) < 1e-6
    noisy = batch.targets + 0.1 * torch.randn(batch.targets.shape, generator=gen)
    assert 0.5 < score(noisy, batch.targets, batch.mask) < 1.0
    assert float(masked_mse(batch.targets, batch.targets, batch.mask)) == 0.0
    # unscored positions do not affect either metric
    junk = batch.targets.clone()
    junk[~batch.mask] = 100.0
    assert score(junk, batch.targets, batch.mask) == 1.0
