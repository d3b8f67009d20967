"""Run the async clients from synchronous code.

Each synchronous client owns a :class:`LoopThread`: an asyncio event loop in a daemon thread.
Coroutines are submitted to it and waited for; async iterators are pulled one item at a time,
so a synchronous ``for result in client.stream_file(...)`` sees each result as it arrives.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An event loop running in its own daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="dlr-client"
        )
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        """Run a coroutine on the loop and wait for its result (exceptions propagate)."""
        if self.loop.is_closed():
            raise RuntimeError("this client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """Iterate an async iterator from this thread, item by item."""
        try:
            while True:
                try:
                    yield self.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:  # the caller stopped early: close the async generator on its loop
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and not self.loop.is_closed():
                self.run(aclose())

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()
