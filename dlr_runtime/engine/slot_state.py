"""One slot's state as tensors (not bytes): export, import, and fork into new slots.

`Engine.snapshot` / `Engine.restore` move a slot's state as checked bytes (for storage and
transfer). Inside one process that framing is not needed: the prefix cache and session forks
copy tensors directly. These functions take an `Engine` and use only its pool and its
canonical-layout conversion, so the stored rows have the RecurrentModel ("torch") layout
whatever backend the engine runs:

- `export_state(engine, slot) -> State`: a copy of the slot's row, canonical layout, no batch
  axis (each tensor as in `RecurrentModel.init_state(1)` without its first dimension).
- `import_state(engine, slot, state)`: write such a row into an allocated slot.
- `copy_state(engine, src, dst)`: copy one slot's state into another allocated slot;
- `fork(engine, slot, n) -> Fork`: allocate n new slots holding copies of `slot`'s state, with
  the time taken and the bytes copied (the cost of n > 1 and of session forks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from .pool import PoolFullError

State = dict[str, torch.Tensor]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def export_state(engine: Any, slot: int) -> State:
    """A copy of one slot's state in the canonical layout (tensors without the batch axis)."""
    row = {k: v.unsqueeze(0) for k, v in engine.pool.row(slot).items()}  # each (1, ...)
    canon = engine._to_canonical(row)
    return {k: v[0].clone() for k, v in canon.items()}


def import_state(engine: Any, slot: int, state: State) -> None:
    """Load a canonical-layout row (from `export_state` or the prefix cache) into a slot."""
    engine.pool.check(slot)
    like = engine._row_like
    if set(state) != set(like):
        raise ValueError(f"state has tensors {sorted(state)}, the engine needs {sorted(like)}")
    for k, ref in like.items():
        if state[k].shape != ref.shape or state[k].dtype != ref.dtype:
            raise ValueError(
                f"state tensor {k!r} is {state[k].dtype} {tuple(state[k].shape)}, "
                f"the engine needs {ref.dtype} {tuple(ref.shape)}"
            )
    idx = engine.pool.index([slot])
    batch = {k: v.unsqueeze(0).to(engine.device) for k, v in state.items()}  # each (1, ...)
    engine.pool.scatter(idx, engine._to_native(batch))
    if "frame_fill" in state:
        engine._fill[slot] = int(state["frame_fill"])


def copy_state(engine: Any, src: int, dst: int) -> int:
    """Copy slot `src`'s state into the allocated slot `dst` (native layout, on the device);
    returns the bytes copied (a session fork into a slot its owner already holds)."""
    engine.pool.check(src)
    engine.pool.check(dst)
    row = engine.pool.gather(engine.pool.index([src]))  # each (1, ...)
    engine.pool.scatter(engine.pool.index([dst]), row)
    engine._fill[dst] = engine._fill[src]
    return engine.state_bytes_per_session()


def state_nbytes(state: State) -> int:
    return sum(t.element_size() * t.numel() for t in state.values())


@dataclass
class Fork:
    """New slots holding copies of one slot's state, and what making them cost."""

    slots: list[int]  # the new slots, in order
    seconds: float  # wall time of allocation + copies (device synchronised)
    bytes_copied: int  # state bytes written into the new slots


def fork(engine: Any, slot: int, n: int) -> Fork:
    """Allocate `n` slots and copy `slot`'s state (native layout, on the device) into each.

    All-or-nothing: if the pool runs out, the slots taken so far are freed and PoolFullError
    propagates. The source slot is not changed.
    """
    if n < 0:
        raise ValueError(f"fork count must be >= 0, got {n}")
    engine.pool.check(slot)
    _sync(engine.device)
    t0 = time.perf_counter()
    taken: list[int] = []
    try:
        for _ in range(n):
            taken.append(engine.open())
    except PoolFullError:
        for s in taken:
            engine.close(s)
        raise
    if taken:
        src = engine.pool.index([slot])
        row = engine.pool.gather(src)  # each (1, ...)
        dst = engine.pool.index(taken)
        engine.pool.scatter(dst, {k: v.expand(n, *v.shape[1:]) for k, v in row.items()})
        for s in taken:
            engine._fill[s] = engine._fill[slot]
    _sync(engine.device)
    seconds = time.perf_counter() - t0
    return Fork(taken, seconds, n * engine.state_bytes_per_session())
