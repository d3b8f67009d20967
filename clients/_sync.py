"""Run the async clients from synchronous code.

Each synchronous client owns a :class:`LoopThread`: an anyio blocking portal, i.e. an event
loop in its own thread. Coroutines are submitted to it and waited for; async iterators are
pulled one item at a time, so a synchronous ``for result in client.stream_file(...)`` sees each
result as it arrives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TypeVar

from anyio.from_thread import start_blocking_portal

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An event loop running in its own thread (anyio's blocking portal)."""

    def __init__(self) -> None:
        self._cm = start_blocking_portal("asyncio")
        self.portal = self._cm.__enter__()
        self.closed = False

    def run(self, coro: Awaitable[T]) -> T:
        """Run a coroutine on the loop and wait for its result (exceptions propagate)."""
        if self.closed:
            raise RuntimeError("this client is closed")

        async def call() -> T:
            return await coro

        return self.portal.call(call)

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
            if aclose is not None and not self.closed:
                self.run(aclose())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cm.__exit__(None, None, None)
