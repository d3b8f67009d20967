"""Request limits as ASGI middleware, applied before any route reads a byte:
`RequestLimits` (bodies) and `ConnectionCap` (WebSockets per client address).

- Size: a body larger than `max_request_bytes` (POST /v1/sessions: `max_state_bytes`) is
  refused with 413 `too_large`: at once when its `Content-Length` says so, and for a chunked
  body as soon as the bytes read pass the limit (the route's read is stopped by an exception
  this middleware turns into the 413; it never surfaces as a 500).
- Time: every body read must deliver within `body_timeout_s` (a client that trickles its body
  or stops half-way gets 408 `request_timeout`). Header read deadlines are the HTTP
  protocol's job (server/http_deadline.py).
- Text: a JSON body (content type JSON, or none: FastAPI parses those as JSON) that holds a
  lone UTF-16 surrogate escape anywhere is refused with 400 `invalid_text` naming the field
  (server/textcheck.py), so no route, tokenizer or log ever sees one.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from prometheus_client import Gauge
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import asgi_error, asgi_ws_refuse
from .settings import Settings
from .textcheck import may_hold_surrogates, surrogate_message, surrogate_path

BODY_METHODS = {"POST", "PUT", "PATCH"}
CLOSE = [(b"connection", b"close")]  # (the rest of a refused body is never read)


class BodyRefused(Exception):
    """A body read failed a limit; the middleware answers `status` if it still can."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


class RequestLimits:
    """The ASGI middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    def limit_of(self, path: str) -> int:
        s = self.settings
        return s.max_state_bytes if path == "/v1/sessions" else s.max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit_of(scope.get("path", ""))
        headers = {k.lower(): v for k, v in scope["headers"]}
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            return await asgi_error(
                send, 413, f"request body larger than {limit} bytes", "too_large", None, CLOSE
            )
        started = False

        async def watched_send(msg: Message) -> None:
            nonlocal started
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            read = self._reader(receive, limit)
            ctype = headers.get(b"content-type", b"").lower()
            if scope.get("method") in BODY_METHODS and (not ctype or b"json" in ctype):
                read = await self._checked_json(read, receive)
            await self.app(scope, read, watched_send)
        except BodyRefused as e:
            if started:  # (the route answered already; nothing more can be said)
                return
            await asgi_error(send, e.status, str(e), e.code, e.param, CLOSE)

    def _reader(self, receive: Receive, limit: int) -> Receive:
        """`receive` with the size limit and the per-read deadline."""
        seen = 0
        done = False  # the whole body arrived: later reads (disconnect listeners) wait freely
        timeout = self.settings.body_timeout_s

        async def read() -> Message:
            nonlocal seen, done
            if done:
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), timeout)
            except TimeoutError:
                raise BodyRefused(
                    408, "request_timeout", f"request body not received within {timeout:g} s"
                ) from None
            if msg["type"] != "http.request":
                done = True
                return msg
            seen += len(msg.get("body", b""))
            if seen > limit:
                raise BodyRefused(413, "too_large", f"request body larger than {limit} bytes")
            done = not msg.get("more_body", False)
            return msg

        return read

    async def _checked_json(self, read: Receive, receive: Receive) -> Receive:
        """Read the whole (size-limited) JSON body, refuse lone surrogates, replay it."""
        chunks: list[bytes] = []
        while True:
            msg = await read()
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        if may_hold_surrogates(body):
            try:
                path = surrogate_path(json.loads(body))
            except (ValueError, RecursionError):
                path = None  # not JSON: the route's parser reports that
            if path is not None:
                raise BodyRefused(400, "invalid_text", surrogate_message(path), path)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


class ConnectionCap:
    """At most `max_connections_per_client` open WebSockets per client address (0 = no cap):
    one more is refused at the handshake (429 `too_many_connections`; close 1013 where the
    server cannot answer in HTTP), so one address cannot hold every socket or slot.
    `gauge` (dlr_open_websockets) counts every WebSocket until its handler (or its refusal)
    returns."""

    def __init__(self, app: ASGIApp, settings: Settings, gauge: Gauge | None = None) -> None:
        self.app = app
        self.cap = settings.max_connections_per_client
        self.gauge = gauge
        self.open: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        if self.gauge is not None:
            self.gauge.inc()
        try:
            await self.capped(scope, receive, send)
        finally:
            if self.gauge is not None:
                self.gauge.dec()

    async def capped(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.cap <= 0:
            return await self.app(scope, receive, send)
        client = (scope.get("client") or ("",))[0]
        if self.open[client] >= self.cap:
            return await asgi_ws_refuse(
                scope,
                receive,
                send,
                429,
                f"more than max_connections_per_client={self.cap} WebSockets from {client}",
                "too_many_connections",
                close_code=1013,
            )
        self.open[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open[client] -= 1
            if self.open[client] <= 0:
                del self.open[client]
