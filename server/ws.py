"""One WebSocket connection: JSON/binary receive with idle timeout and size limit, a send lock,
error + close with the fitting code, refusal (1013) and going-away (1001).

It knows the settings and metrics only: sessions (server/sessions/) send through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketState

from .admission import Refusal
from .errors import WS_CLOSE, Closed
from .jsonsafe import dumps
from .metrics import Metrics
from .settings import Settings
from .textcheck import may_hold_surrogates, surrogate_message, surrogate_path

# server errors that close a session and count as an eviction (metric reason = the code)
EVICTIONS = ("idle_timeout", "queue_full", "frame_too_big", "internal_error", "going_away")


class Conn:
    """One WebSocket connection with a send lock (partials and replies come from two tasks)."""

    def __init__(self, ws: WebSocket, settings: Settings, metrics: Metrics) -> None:
        self.ws, self.settings, self.metrics = ws, settings, metrics
        self.lock = asyncio.Lock()
        self.model = ""  # for eviction metrics
        self.last_final: dict | None = None  # a resumed session's replayed final
        # idle watchdog: one timer per connection, re-armed from the time of the receive in
        # progress, instead of a timeout context (a timer handle) per received message
        self._since = 0.0  # loop time the current receive began
        self._receiver: asyncio.Task | None = None  # the task waiting in receive(), if any
        self._watch: asyncio.TimerHandle | None = None
        self._idle_cancel: int | None = None  # cancelling() count before the watchdog cancelled

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._watch = loop.call_at(self._since + self.settings.idle_timeout_s, self._check)

    def _check(self) -> None:
        """Watchdog: cancel the waiting receive once it has waited idle_timeout_s; stop when
        no receive is pending (the next one re-arms)."""
        self._watch = None
        task = self._receiver
        if task is None or task.done():
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._since >= self.settings.idle_timeout_s:
            self._idle_cancel = task.cancelling()
            task.cancel()
        else:
            self._arm(loop)

    @property
    def open(self) -> bool:
        return self.ws.application_state == WebSocketState.CONNECTED

    async def send(self, msg: dict[str, Any]) -> None:
        if not self.open:
            raise Closed("gone", by_client=True, code=1006)
        async with self.lock:
            try:
                await self.ws.send_text(dumps(msg))
            except Exception as e:  # noqa: BLE001  (peer went away while sending)
                raise Closed("gone", by_client=True, code=1006) from e

    async def close(self, code: int, reason: str) -> None:
        try:
            async with self.lock:
                if self.open:
                    await self.ws.close(code=code, reason=reason[:120])
        except Exception:  # noqa: BLE001, S110  (already gone)
            pass

    async def fail(self, code: str, message: str, **extra: Any) -> Closed:
        """Send an error message, close with the fitting code; returns Closed to raise."""
        with contextlib.suppress(Closed):
            await self.send({"type": "error", "code": code, "message": message, **extra})
        await self.close(WS_CLOSE.get(code, 1011), code)
        if code in EVICTIONS:
            self.metrics.evictions.labels(self.model or "-", code).inc()
        return Closed(code)

    async def receive(self) -> tuple[str | None, bytes | None]:
        """Next message as (text, None) or (None, bytes), enforcing idle timeout and size."""
        loop = asyncio.get_running_loop()
        self._since = loop.time()
        self._receiver = asyncio.current_task()
        if self._watch is None:
            self._arm(loop)
        try:
            msg = await self.ws.receive()
        except asyncio.CancelledError:
            task, before = self._receiver, self._idle_cancel
            self._idle_cancel = None
            if before is None or task is None or task.uncancel() > before:
                raise  # cancelled by someone else (the server is stopping)
            raise await self.fail(
                "idle_timeout",
                f"no message for {self.settings.idle_timeout_s:g} s; the session is closed",
            ) from None
        except RuntimeError as e:  # receive after the server closed the socket
            raise Closed("gone", by_client=True, code=1006) from e
        finally:
            self._receiver = None
        if msg["type"] == "websocket.disconnect":
            raise Closed("client_closed", by_client=True, code=msg.get("code", 1006))
        text, data = msg.get("text"), msg.get("bytes")
        size = len(data) if data is not None else len((text or "").encode())
        if size > self.settings.max_frame_bytes:
            raise await self.fail(
                "frame_too_big",
                f"message of {size} bytes exceeds max_frame_bytes={self.settings.max_frame_bytes}",
            )
        return text, data

    async def receive_json(self, text: str) -> dict[str, Any]:
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise await self.fail("invalid_json", f"message is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise await self.fail("invalid_message", "message must be a JSON object")
        if may_hold_surrogates(text) and (path := surrogate_path(obj)) is not None:
            raise await self.fail("invalid_text", surrogate_message(path), param=path)
        return obj

    async def accept(self) -> None:
        """Accept the handshake, echoing the auth subprotocol if one was offered."""
        await self.ws.accept(subprotocol=self.ws.scope.get("dlr.subprotocol"))

    async def refuse(self, r: Refusal) -> Closed:
        """Refuse new work (error `overloaded` + 1013); returns Closed to raise."""
        return await self.fail("overloaded", r.message, retry_after_s=r.retry_after_s)

    async def going_away(self, sid: str, resumable: bool) -> None:
        """Tell the client the server is stopping, then close 1001."""
        with contextlib.suppress(Closed):
            await self.send(
                {
                    "type": "going_away",
                    "code": "going_away",
                    "message": "the server is restarting"
                    + ("; resume this session with its id and token" if resumable else ""),
                    "session_id": sid,
                    "resume": resumable,
                    "retry_after_s": self.settings.retry_after_s,
                }
            )
        await self.close(1001, "going_away: resume" if resumable else "going_away")
        self.metrics.evictions.labels(self.model or "-", "going_away").inc()
