"""A deadline on reading request headers (slowloris): uvicorn's HTTP protocol closes idle
keep-alive connections but waits forever for the headers of a request that has begun, or of
a connection that never sends anything.

`deadline_protocol(timeout_s)` is uvicorn's HTTP protocol class (httptools when installed,
else h11) with a timer armed when a connection opens and after each response: if the next
request's headers are not complete `timeout_s` later, the connection is closed. A WebSocket
upgrade hands the transport to another protocol, which the timer then leaves alone. Request
*bodies* have their own read deadline (server/limits.py).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Default
except ImportError:  # pragma: no cover  (httptools is optional)
    _Default = H11Protocol  # type: ignore[misc,assignment]


def deadline_protocol(timeout_s: float, base: type = _Default) -> type[asyncio.Protocol]:
    """`base` with a header-read deadline of `timeout_s` seconds."""

    class HeaderDeadline(base):  # type: ignore[misc,valid-type]
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _waiting_for_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _expired(self) -> None:
            self._deadline = None
            t = self.transport
            if t.is_closing() or t.get_protocol() is not self:  # closed, or upgraded
                return
            if self._waiting_for_headers():
                t.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:  # type: ignore[override]
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

    HeaderDeadline.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline
