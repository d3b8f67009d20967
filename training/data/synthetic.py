"""Synthetic sequence-to-sequence task suite of the DLR paper, generated on the fly.

Conventions shared by every task (``B`` = batch, ``L`` = the requested length):

* ``inputs`` is float32 ``[B, T, in_features(task)]``. Its last two channels are always the
  position phase ``cos(2*pi*t/T), sin(2*pi*t/T)`` for ``t = 0..T-1``; the channels before them
  are task data (``value`` first). ``T = input_length(task, L)``.
* ``targets`` is float32 ``[B, T, out_features(task)]``: one output per input step (so a causal
  sequence model maps inputs to targets step by step). Unscored positions hold zeros.
* ``mask`` is bool ``[B, T]``: which output positions are scored.
* Random values are standard normal, then scaled so that ``max |value| = 1`` per sequence.
* Everything is drawn from the ``torch.Generator`` given to :func:`make_batch` (on CPU), so a
  batch is a pure function of the generator state; the ``*_fixed`` tasks also use a private
  generator seeded from ``SyntheticConfig.fixed_seed`` and ``L`` so they share positions / the
  matrix across all batches.

Use :func:`score` (R^2 on scored positions, clipped to [0, 1]) to compare a model's predictions
with the targets; a perfect model scores 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "TASKS",
    "SyntheticConfig",
    "TaskBatch",
    "in_features",
    "input_length",
    "make_batch",
    "masked_mse",
    "out_features",
    "score",
]


@dataclass(frozen=True)
class SyntheticConfig:
    """Task hyper-parameters that are not the sequence length."""

    # shift: number K of output channels; channel k is shifted by k * L // K.
    shift_channels: int = 4
    # masked_select(_fixed): number M of marked tokens to recall (capped at L).
    select_count: int = 8
    # solve(_fixed): matrix size n; None picks the largest n with n*n + 2n <= L.
    solve_dim: int | None = None
    # mips: dimension of keys and queries.
    mips_key_dim: int = 4
    # mips: dimension of values (= out_features).
    mips_value_dim: int = 1
    # mips: fraction of the L steps that are queries (at least one key and one query).
    mips_query_fraction: float = 0.5
    # mips: False = all keys first, then all queries; True = queries at random steps after the
    # first key, so each query only sees the keys before it.
    mips_interleave: bool = False
    # mips: device for the O(L^2) brute-force answer search (e.g. "cuda"); None = CPU.
    mips_device: str | None = None
    # Seed of the shared positions / matrix of the *_fixed tasks.
    fixed_seed: int = 1234


class TaskBatch(NamedTuple):
    """One batch of a synthetic task."""

    inputs: torch.Tensor  # float32 [B, T, in_features]
    targets: torch.Tensor  # float32 [B, T, out_features]
    mask: torch.Tensor  # bool [B, T], scored output positions


TaskFn = Callable[[int, int, torch.Generator, SyntheticConfig], TaskBatch]


# ---------------------------------------------------------------------------------------------
# helpers


def _values(batch: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """Standard normal ``[B, n]`` scaled so that each row has max |x| = 1."""
    x = torch.randn(batch, n, generator=gen)
    return x / x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)


def _with_phase(data: torch.Tensor) -> torch.Tensor:
    """Append the ``cos, sin`` position phase to ``data`` ``[B, T]`` or ``[B, T, C]``."""
    if data.dim() == 2:
        data = data.unsqueeze(-1)
    batch, steps, _ = data.shape
    phase = 2.0 * math.pi * torch.arange(steps, dtype=torch.float32) / steps
    pos = torch.stack([phase.cos(), phase.sin()], dim=-1).expand(batch, steps, 2)
    return torch.cat([data.float(), pos], dim=-1)


def _shifted(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``out[b, t] = x[b, t - shift[b]]`` (zero where ``t < shift[b]``) for ``x`` ``[B, L]``."""
    t = torch.arange(x.shape[1])
    idx = t[None, :] - shift[:, None]
    return x.gather(1, idx.clamp_min(0)) * (idx >= 0)


def _fixed_generator(config: SyntheticConfig, task: str, length: int) -> torch.Generator:
    salt = sum(ord(c) * 31**i for i, c in enumerate(task)) % 1_000_003
    return torch.Generator().manual_seed(config.fixed_seed * 1_000_003 + salt + 7919 * length)


def _solve_dim(length: int, config: SyntheticConfig) -> int:
    n = config.solve_dim if config.solve_dim is not None else math.isqrt(length + 1) - 1
    if n < 1:
        raise ValueError(f"solve needs length >= 3 (n*n + 2n with n >= 1), got {length}")
    return n


def _mips_counts(length: int, config: SyntheticConfig) -> tuple[int, int]:
    if length < 2:
        raise ValueError("mips needs length >= 2")
    queries = min(length - 1, max(1, round(length * config.mips_query_fraction)))
    return length - queries, queries


# ---------------------------------------------------------------------------------------------
# tasks


def shift(batch: int, length: int, gen: torch.Generator, config: SyntheticConfig) -> TaskBatch:
    """Shift the input right by K different amounts.

    inputs ``[B, L, 3]`` = (x, cos, sin); targets ``[B, L, K]`` with
    ``targets[:, t, k] = x[t - k*L//K]`` (0 for ``t < k*L//K``); every position is scored.
    """
    k = config.shift_channels
    x = _values(batch, length, gen)
    cols = [_shifted(x, torch.full((batch,), i * length // k)) for i in range(k)]
    targets = torch.stack(cols, dim=-1)
    return TaskBatch(_with_phase(x), targets, torch.ones(batch, length, dtype=torch.bool))


def cumsum(batch: int, length: int, gen: torch.Generator, config: SyntheticConfig) -> TaskBatch:
    """Normalised running sum.

    inputs ``[B, L, 3]`` = (x, cos, sin); ``targets[:, t, 0] = sum(x[:t+1]) / sqrt(t + 1)``;
    every position is scored.
    """
    x = _values(batch, length, gen)
    norm = torch.arange(1, length + 1, dtype=torch.float32).sqrt()
    targets = (x.cumsum(dim=1) / norm).unsqueeze(-1)
    return TaskBatch(_with_phase(x), targets, torch.ones(batch, length, dtype=torch.bool))


def cummax(batch: int, length: int, gen: torch.Generator, config: SyntheticConfig) -> TaskBatch:
    """Running maximum.

    inputs ``[B, L, 3]`` = (x, cos, sin); ``targets[:, t, 0] = max(x[:t+1])``; all scored.
    """
    x = _values(batch, length, gen)
    targets = x.cummax(dim=1).values.unsqueeze(-1)
    return TaskBatch(_with_phase(x), targets, torch.ones(batch, length, dtype=torch.bool))


def _second_half(x: torch.Tensor, answer: torch.Tensor) -> TaskBatch:
    batch, length = x.shape
    values = torch.cat([x, torch.zeros_like(x)], dim=1)
    targets = torch.cat([torch.zeros_like(answer), answer], dim=1).unsqueeze(-1)
    mask = torch.zeros(batch, 2 * length, dtype=torch.bool)
    mask[:, length:] = True
    return TaskBatch(_with_phase(values), targets, mask)


def reverse(batch: int, length: int, gen: torch.Generator, config: SyntheticConfig) -> TaskBatch:
    """Reverse the sequence.

    inputs ``[B, 2L, 3]``: values ``x[0..L-1]`` then ``L`` zeros. ``targets[:, L + j, 0] =
    x[L - 1 - j]``; only the second half (``t >= L``) is scored.
    """
    x = _values(batch, length, gen)
    return _second_half(x, x.flip(1))


def sort(batch: int, length: int, gen: torch.Generator, config: SyntheticConfig) -> TaskBatch:
    """Sort by distance to the first element.

    inputs ``[B, 2L, 3]``: values ``x[0..L-1]`` then ``L`` zeros. ``targets[:, L:, 0]`` is ``x``
    ordered by increasing ``|x[i] - x[0]|`` (so it starts with ``x[0]``); second half scored.
    """
    x = _values(batch, length, gen)
    order = (x - x[:, :1]).abs().argsort(dim=1, stable=True)
    return _second_half(x, x.gather(1, order))


def context_shift(
    batch: int, length: int, gen: torch.Generator, config: SyntheticConfig
) -> TaskBatch:
    """Shift by an amount given in the input.

    A shift ``s`` is drawn uniformly from ``0..L-1`` per sample. inputs ``[B, L + 2, 3]``:
    value[0] = ``cos(2*pi*s/L)``, value[1] = ``sin(2*pi*s/L)``, value[2 + t] = ``x[t]``.
    ``targets[:, 2 + t, 0] = x[t - s]`` (0 for ``t < s``); positions ``>= 2`` are scored.
    """
    x = _values(batch, length, gen)
    s = torch.randint(0, length, (batch,), generator=gen)
    angle = 2.0 * math.pi * s.float() / length
    values = torch.cat([angle.cos()[:, None], angle.sin()[:, None], x], dim=1)
    answer = _shifted(x, s)
    targets = torch.cat([torch.zeros(batch, 2), answer], dim=1).unsqueeze(-1)
    mask = torch.ones(batch, length + 2, dtype=torch.bool)
    mask[:, :2] = False
    return TaskBatch(_with_phase(values), targets, mask)


def _select(
    x: torch.Tensor, positions: torch.Tensor
) -> TaskBatch:  # positions: [B, M] sorted indices
    batch, length = x.shape
    count = positions.shape[1]
    marks = torch.zeros(batch, length + count)
    marks.scatter_(1, positions, 1.0)
    values = torch.cat([x, torch.zeros(batch, count)], dim=1)
    answer = x.gather(1, positions)
    targets = torch.cat([torch.zeros(batch, length), answer], dim=1).unsqueeze(-1)
    mask = torch.zeros(batch, length + count, dtype=torch.bool)
    mask[:, length:] = True
    return TaskBatch(_with_phase(torch.stack([values, marks], dim=-1)), targets, mask)


def masked_select(
    batch: int, length: int, gen: torch.Generator, config: SyntheticConfig
) -> TaskBatch:
    """Recall the marked tokens in order.

    ``M = min(select_count, L)`` distinct positions ``p_0 < ... < p_{M-1}`` are drawn per sample.
    inputs ``[B, L + M, 4]`` = (value, mark, cos, sin): value = ``x[0..L-1]`` then ``M`` zeros;
    mark = 1 at the ``p_j``, else 0. ``targets[:, L + j, 0] = x[p_j]``; only the last ``M``
    positions are scored.
    """
    count = min(config.select_count, length)
    x = _values(batch, length, gen)
    positions = torch.rand(batch, length, generator=gen).argsort(dim=1)[:, :count]
    return _select(x, positions.sort(dim=1).values)


def masked_select_fixed(
    batch: int, length: int, gen: torch.Generator, config: SyntheticConfig
) -> TaskBatch:
    """:func:`masked_select` with the same marked positions in every sample and batch.

    The positions depend only on ``(config.fixed_seed, L, M)``; the layout (including the mark
    channel) is identical to ``masked_select``.
    """
    count = min(config.select_count, length)
    fixed = _fixed_generator(config, "masked_select_fixed", length)
    positions = torch.randperm(length, generator=fixed)[:count].sort().values
    x = _values(batch, length, gen)
    return _select(x, positions.expand(batch, count).contiguous())


def _orthogonal(batch: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """Haar-random orthogonal matrices ``[B, n, n]``."""
    q, r = torch.linalg.qr(torch.randn(batch, n, n, generator=gen, dtype=torch.float64))
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs[signs == 0] = 1.0
    return q * signs[:, None, :]


def _solve(a: torch.Tensor, gen: torch.Generator) -> TaskBatch:
    batch, n, _ = a.shape
    x = torch.randn(batch, n, generator=gen, dtype=torch.float64)
    x = x / x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    b = (a @ x.unsqueeze(-1)).squeeze(-1)
    given = torch.cat([a.reshape(batch, n * n), b], dim=1)
    given = given / given.abs().amax(dim=1, keepdim=True)  # (cA) x = (cb): x is unchanged
    values = torch.cat([given, torch.zeros(batch, n, dtype=given.dtype)], dim=1).float()
    targets = torch.cat([torch.zeros(batch, n * n + n), x], dim=1).float().unsqueeze(-1)
    mask = torch.zeros(batch, n * n + 2 * n, dtype=torch.bool)
    mask[:, n * n + n :] = True
    return TaskBatch(_with_phase(values), targets, mask)


def solve(batch: int, length: int, gen: torch.Generator, config: SyntheticConfig) -> TaskBatch:
    """Solve ``A x = b`` for an orthogonal ``A``.

    ``n = solve_dim`` (default: largest n with ``n*n + 2n <= L``); ``T = n*n + 2n``.
    value = ``c*A`` row-major (``n*n`` steps), then ``c*b`` (``n`` steps), then ``n`` zeros, where
    ``b = A x``, ``x`` is normal scaled to max |x| = 1 and ``c`` scales the given part to max
    |value| = 1 (``(cA) x = cb``). ``targets[:, n*n + n + i, 0] = x[i]``; the last ``n``
    positions are scored. A is Haar-random per sample. inputs ``[B, T, 3]``.
    """
    n = _solve_dim(length, config)
    return _solve(_orthogonal(batch, n, gen), gen)


def solve_fixed(
    batch: int, length: int, gen: torch.Generator, config: SyntheticConfig
) -> TaskBatch:
    """:func:`solve` with one orthogonal ``A`` (from ``(fixed_seed, L)``) for all samples.

    The layout is identical to ``solve`` (``A`` is still spelled out in the input).
    """
    n = _solve_dim(length, config)
    a = _orthogonal(1, n, _fixed_generator(config, "solve_fixed", length))
    return _solve(a.expand(batch, n, n).contiguous(), gen)


def mips(batch: int, length: int, gen: torch.Generator, config: SyntheticConfig) -> TaskBatch:
    """Causal maximum-inner-product search.

    Each of the ``L`` steps is a key step (key ``k`` in R^d, value ``v`` in R^dv) or a query
    step (query ``q`` in R^d); ``d = mips_key_dim``, ``dv = mips_value_dim``. With
    ``mips_interleave=False`` the first ``L - Q`` steps are keys and the last ``Q`` queries
    (``Q = round(L * mips_query_fraction)``, clamped to 1..L-1); with ``True`` step 0 is a key
    and ``Q`` query steps are drawn at random among steps 1..L-1.
    inputs ``[B, L, 2d + dv + 2]`` = (k, v, q, cos, sin): key steps carry (k, v, 0), query steps
    (0, 0, q); all of k, v, q are jointly scaled to max |.| = 1 per sequence.
    ``targets[:, t]`` at a query step is the ``v`` of the earlier key step maximising ``<k, q_t>``;
    only query steps are scored (``[B, L, dv]``). The answer search is brute force, O(L^2 d)
    per sample; set ``mips_device="cuda"`` to run it on a GPU for long sequences.
    """
    d, dv = config.mips_key_dim, config.mips_value_dim
    n_keys, n_queries = _mips_counts(length, config)
    if config.mips_interleave:
        picks = torch.rand(batch, length - 1, generator=gen).argsort(dim=1)[:, :n_queries] + 1
        is_query = torch.zeros(batch, length, dtype=torch.bool).scatter_(1, picks, True)
    else:
        is_query = torch.zeros(batch, length, dtype=torch.bool)
        is_query[:, n_keys:] = True
    data = torch.randn(batch, length, 2 * d + dv, generator=gen)
    key_part = (~is_query).unsqueeze(-1).float()
    data[..., : d + dv] *= key_part
    data[..., d + dv :] *= 1.0 - key_part
    data = data / data.abs().amax(dim=(1, 2), keepdim=True)
    keys, vals, queries = data[..., :d], data[..., d : d + dv], data[..., d + dv :]

    # Compact per-sample key and query lists (every sample has n_keys keys, n_queries queries).
    key_pos = (~is_query).nonzero()[:, 1].view(batch, n_keys)
    query_pos = is_query.nonzero()[:, 1].view(batch, n_queries)
    k = keys.gather(1, key_pos.unsqueeze(-1).expand(-1, -1, d))
    v = vals.gather(1, key_pos.unsqueeze(-1).expand(-1, -1, dv))
    q = queries.gather(1, query_pos.unsqueeze(-1).expand(-1, -1, d))
    dev = torch.device(config.mips_device or "cpu")
    key_pos, query_pos, k, v, q = (t.to(dev) for t in (key_pos, query_pos, k, v, q))
    answers = torch.empty(batch, n_queries, dv, device=dev)
    block = max(1, 2**23 // max(1, batch * n_keys))
    for start in range(0, n_queries, block):
        sim = torch.einsum("bqd,bkd->bqk", q[:, start : start + block], k)
        if config.mips_interleave:
            later = key_pos[:, None, :] > query_pos[:, start : start + block, None]
            sim = sim.masked_fill(later, float("-inf"))
        best = sim.argmax(dim=-1)
        answers[:, start : start + block] = v.gather(1, best.unsqueeze(-1).expand(-1, -1, dv))
    targets = torch.zeros(batch, length, dv)
    targets.scatter_(1, query_pos.cpu().unsqueeze(-1).expand(-1, -1, dv), answers.cpu())
    return TaskBatch(_with_phase(data), targets, is_query)


#: Registry of task name -> generator ``fn(batch, length, generator, config) -> TaskBatch``.
TASKS: dict[str, TaskFn] = {
    "shift": shift,
    "cumsum": cumsum,
    "cummax": cummax,
    "reverse": reverse,
    "sort": sort,
    "context_shift": context_shift,
    "masked_select": masked_select,
    "masked_select_fixed": masked_select_fixed,
    "solve": solve,
    "solve_fixed": solve_fixed,
    "mips": mips,
}


# ---------------------------------------------------------------------------------------------
# public API


def _task(task: str) -> TaskFn:
    try:
        return TASKS[task]
    except KeyError:
        raise KeyError(f"unknown task {task!r}; expected one of {sorted(TASKS)}") from None


def make_batch(
    task: str,
    batch: int,
    length: int,
    generator: torch.Generator,
    config: SyntheticConfig | None = None,
    device: torch.device | str | None = None,
) -> TaskBatch:
    """Draw one batch of ``task`` at length ``length`` from ``generator`` (a CPU generator)."""
    out = _task(task)(batch, length, generator, config or SyntheticConfig())
    if device is not None:
        out = TaskBatch(*(t.to(device) for t in out))
    return out


def in_features(task: str, config: SyntheticConfig | None = None) -> int:
    """Input channels of ``task``: 3 = (value, cos, sin), 4 for masked_select*, 2d+dv+2 for mips."""
    config = config or SyntheticConfig()
    _task(task)
    if task.startswith("masked_select"):
        return 4
    if task == "mips":
        return 2 * config.mips_key_dim + config.mips_value_dim + 2
    return 3


def out_features(task: str, config: SyntheticConfig | None = None) -> int:
    """Output channels of ``task``: K for shift, mips_value_dim for mips, else 1."""
    config = config or SyntheticConfig()
    _task(task)
    if task == "shift":
        return config.shift_channels
    if task == "mips":
        return config.mips_value_dim
    return 1


def input_length(task: str, length: int, config: SyntheticConfig | None = None) -> int:
    """Sequence length ``T`` of inputs/targets/mask produced for the requested ``length``."""
    config = config or SyntheticConfig()
    _task(task)
    if task in ("reverse", "sort"):
        return 2 * length
    if task == "context_shift":
        return length + 2
    if task.startswith("masked_select"):
        return length + min(config.select_count, length)
    if task.startswith("solve"):
        n = _solve_dim(length, config)
        return n * n + 2 * n
    return length


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over scored positions (all channels); differentiable training loss."""
    weight = mask.unsqueeze(-1).to(pred.dtype)
    count = weight.sum().clamp_min(1.0) * pred.shape[-1]
    return ((pred - target) ** 2 * weight).sum() / count


@torch.no_grad()
def score(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """R^2 on scored positions, clipped to [0, 1]: ``1 - SSE / SST``.

    SST uses the per-channel mean of the scored targets, so predicting that mean scores 0 and
    an exact prediction scores 1.
    """
    m = mask.bool()
    p = pred[m].double()
    t = target[m].double()
    if t.numel() == 0:
        return 1.0
    sse = ((p - t) ** 2).sum()
    sst = ((t - t.mean(dim=0, keepdim=True)) ** 2).sum()
    if sst <= 0:
        return 1.0 if sse <= 1e-12 else 0.0
    return float((1.0 - sse / sst).clamp(0.0, 1.0))
