"""Shared WebSocket plumbing: JSON/binary receive with idle timeout and size limit, error+close."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketState

from ..errors import WS_CLOSE
from ..state import ServerState


class Closed(Exception):
    """The connection is over (client left, or the server closed it after an error)."""


class Conn:
    """One WebSocket connection with a send lock (partials and replies come from two tasks)."""

    def __init__(self, ws: WebSocket, st: ServerState, model: str = "") -> None:
        self.ws, self.st = ws, st
        self.lock = asyncio.Lock()
        self.model = model  # for eviction metrics

    async def send(self, msg: dict[str, Any]) -> None:
        if self.ws.application_state != WebSocketState.CONNECTED:
            raise Closed()
        async with self.lock:
            try:
                await self.ws.send_text(json.dumps(msg))
            except Exception as e:  # noqa: BLE001  (peer went away while sending)
                raise Closed() from e

    async def fail(self, code: str, message: str) -> Closed:
        """Send an error message, close with the fitting code; returns Closed to raise."""
        try:
            await self.send({"type": "error", "code": code, "message": message})
            async with self.lock:
                await self.ws.close(code=WS_CLOSE.get(code, 1011), reason=code)
        except Exception:  # noqa: BLE001, S110  (already gone)
            pass
        if code in ("idle_timeout", "queue_full", "frame_too_big", "internal_error"):
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
        if msg["type"] == "websocket.disconnect":
            raise Closed()
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
        except json.JSONDecodeError as e:
            raise await self.fail("invalid_json", f"message is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise await self.fail("invalid_message", "message must be a JSON object")
        return obj

    async def admit(self) -> None:
        """Accept the handshake; refuse with 1013 when the server is at its session limit."""
        await self.ws.accept()
        if self.st.full():
            self.st.metrics.rejections.labels("sessions_full").inc()
            raise await self.fail("overloaded", "the server is at its session limit; retry later")
