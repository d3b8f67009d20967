"""Condition waits for tests: poll until a condition holds, with a timeout (no fixed sleeps)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def eventually_sync(cond: Callable[[], object], timeout: float = 10.0, every: float = 0.02):
    """Return `cond()`'s first truthy value; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {cond}")
        time.sleep(every)


async def eventually(cond: Callable[[], object], timeout: float = 10.0, every: float = 0.02):
    """Async twin of `eventually_sync` (the event loop keeps running while it waits)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {cond}")
        await asyncio.sleep(every)
