"""Calibration timings of backend calls, through `torch.utils.benchmark.Timer`.

    seconds = per_call_seconds(lambda: backend.step(tok, state), calls=7)

The Timer warms the call up first, synchronises CUDA around the timed block when CUDA is
present, and runs with the process's own torch thread count (its default is one thread, which
would time a different program than the one the server runs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.benchmark import Timer


def per_call_seconds(fn: Callable[[], object], calls: int) -> float:
    """Mean seconds of one call of `fn` over a block of `calls` calls (after a warm-up)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.timeit(calls).median
