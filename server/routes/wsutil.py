"""Shared WebSocket plumbing: JSON/binary receive with idle timeout and size limit, error+close."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketState

from ..errors import WS_CLOSE
from ..state import ServerState

# server errors that close a session and count as an eviction (metric reason = the code)
EVICTIONS = ("idle_timeout", "queue_full", "frame_too_big", "internal_error", "going_away")


class Closed(Exception):
    """The connection is over. `by_client`: the peer left (close code `code`, 1006 when the
    link just dropped); otherwise the server closed it after an error (str(self) = the code)."""

    def __init__(self, reason: str = "", by_client: bool = False, code: int | None = None):
        super().__init__(reason)
        self.by_client, self.code = by_client, code

    @property
    def resumable(self) -> bool:
        """A drop that keeps the session for resume (anything but a clean close)."""
        return self.by_client and self.code != 1000


class Conn:
    """One WebSocket connection with a send lock (partials and replies come from two tasks)."""

    def __init__(self, ws: WebSocket, st: ServerState, model: str = "") -> None:
        self.ws, self.st = ws, st
        self.lock = asyncio.Lock()
        self.model = model  # for eviction metrics
        self.last_final: dict | None = None  # a resumed session's replayed final

    @property
    def open(self) -> bool:
        return self.ws.application_state == WebSocketState.CONNECTED

    async def send(self, msg: dict[str, Any]) -> None:
        if not self.open:
            raise Closed("gone", by_client=True, code=1006)
        async with self.lock:
            try:
                await self.ws.send_text(json.dumps(msg))
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
            self.st.metrics.evictions.labels(self.model or "-", code).inc()
        return Closed(code)

    async def receive(self) -> tuple[str | None, bytes | None]:
        """Next message as (text, None) or (None, bytes), enforcing idle timeout and size."""
        try:
            msg = await asyncio.wait_for(self.ws.receive(), self.st.settings.idle_timeout_s)
        except TimeoutError:
            raise await self.fail(
                "idle_timeout",
                f"no message for {self.st.settings.idle_timeout_s:g} s; the session is closed",
            ) from None
        except RuntimeError as e:  # receive after the server closed the socket
            raise Closed("gone", by_client=True, code=1006) from e
        if msg["type"] == "websocket.disconnect":
            raise Closed("client_closed", by_client=True, code=msg.get("code", 1006))
        text, data = msg.get("text"), msg.get("bytes")
        size = len(data) if data is not None else len((text or "").encode())
        if size > self.st.settings.max_frame_bytes:
            raise await self.fail(
                "frame_too_big",
                f"message of {size} bytes exceeds max_frame_bytes={self.st.settings.max_frame_bytes}",
            )
        return text, data

    async def receive_json(self, text: str) -> dict[str, Any]:
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise await self.fail("invalid_json", f"message is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise await self.fail("invalid_message", "message must be a JSON object")
        return obj

    async def admit(self) -> None:
        """Accept the handshake (echoing the auth subprotocol, if one was offered); refuse with
        1013 when the server is draining or at its session limit."""
        await self.ws.accept(subprotocol=self.ws.scope.get("dlr.subprotocol"))
        await self.check_admission()

    async def check_admission(self) -> None:
        st = self.st
        if st.draining:
            st.metrics.rejections.labels("draining").inc()
            raise await self.fail(
                "overloaded",
                "the server is shutting down; connect again (another replica) shortly",
                retry_after_s=st.settings.retry_after_s,
            )
        if st.full():
            st.metrics.rejections.labels("sessions_full").inc()
            raise await self.fail(
                "overloaded",
                "the server is at its session limit; retry later",
                retry_after_s=st.settings.retry_after_s,
            )
        why = st.overloaded()
        if why:
            st.metrics.rejections.labels("queue_full").inc()
            raise await self.fail(
                "overloaded", f"{why}; retry later", retry_after_s=st.settings.retry_after_s
            )

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
                    "retry_after_s": self.st.settings.retry_after_s,
                }
            )
        await self.close(1001, "going_away: resume" if resumable else "going_away")
        self.st.metrics.evictions.labels(self.model or "-", "going_away").inc()
