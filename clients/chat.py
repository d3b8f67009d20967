"""Persistent text session over ``WS /v1/generate/stream`` (async).

The session's recurrent state lives on the server: ``append`` feeds text into it, ``generate``
streams new tokens that also stay in it, so each turn sends only the new text::

    async with AsyncChatSession("http://127.0.0.1:8000") as chat:
        await chat.append("Q: Who is Hamlet?\\nA:")
        async for event in chat.generate(max_new_tokens=40, stop=["\\n"]):
            print(event.text, end="", flush=True)

If the connection drops between turns and the server gave a resume token, the next call
reconnects and resumes the same session (state intact) before sending.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from clients._ws import ClientBase, Disconnected, WSConnection
from clients.errors import ConnectionFailed, ProtocolError
from clients.generate import sampling_body
from clients.types import GenerateResult, TokenEvent, Usage

__all__ = ["CHAT_PATH", "AsyncChatSession"]

CHAT_PATH = "/v1/generate/stream"
_INFO_TYPES = ("appended", "ack", "ping", "pong", "info", "warning", "ready", "resumed")


class AsyncChatSession(ClientBase):
    """One server-side text session; use as an async context manager.

    Keyword arguments: those of :class:`~clients._ws.ClientBase` (model, api_key, timeouts, ...).
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self._conn: WSConnection | None = None
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.ready_info: dict[str, Any] = {}
        self.reconnects = 0

    async def __aenter__(self) -> AsyncChatSession:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect and start a fresh session (``start`` -> ``ready``)."""
        self._conn = WSConnection(self.cfg, CHAT_PATH)
        await self._conn.open()
        start: dict[str, Any] = {"type": "start"}
        if self.model:
            start["model"] = self.model
        await self._conn.send_json(start)
        ready = await self._conn.recv()
        if ready.get("type") != "ready":
            raise ProtocolError(f"expected 'ready' after 'start', got {ready!r}")
        self.ready_info = ready
        self.session_id = ready.get("session_id")
        self.resume_token = ready.get("resume_token")

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _resume(self) -> None:
        last: Exception | None = None
        for attempt in range(1, self.cfg.max_reconnects + 1):
            await asyncio.sleep(self.cfg.reconnect_backoff * 2 ** (attempt - 1))
            conn = WSConnection(self.cfg, CHAT_PATH)
            try:
                await conn.open()
                await conn.send_json(
                    {
                        "type": "resume",
                        "session_id": self.session_id,
                        "resume_token": self.resume_token,
                    }
                )
                ready = await conn.recv()
            except ConnectionFailed as exc:
                last = exc
                continue
            if ready.get("type") not in ("ready", "resumed"):
                raise ProtocolError(f"expected 'ready' after 'resume', got {ready!r}")
            self.resume_token = ready.get("resume_token", self.resume_token)
            self._conn = conn
            self.reconnects += 1
            return
        raise ConnectionFailed(f"could not resume session {self.session_id}: {last}")

    async def _send(self, msg: dict[str, Any]) -> None:
        """Send one message; if the link is down and the session is resumable, resume first."""
        if self._conn is None:
            raise ConnectionFailed("session is closed; call open()")
        try:
            if not self._conn.is_open:
                raise Disconnected(
                    "connection is closed", self._conn._ws and self._conn._ws.close_code
                )
            await self._conn.send_json(msg)
        except Disconnected as exc:
            if not (exc.resumable and self.resume_token and self.cfg.max_reconnects > 0):
                raise
            await self._resume()
            await self._conn.send_json(msg)

    async def append(self, text: str) -> None:
        """Feed ``text`` into the session's state (prefill); no tokens are generated."""
        await self._send({"type": "append", "text": text})

    async def generate(self, **params: Any) -> AsyncIterator[TokenEvent]:
        """Generate from the current state; yields token events, the last with finish_reason.

        Parameters are those of ``/v1/generate``: max_new_tokens, temperature, top_k, top_p,
        seed, stop.
        """
        await self._send({"type": "generate", **sampling_body(**params)})
        assert self._conn is not None
        while True:
            msg = await self._conn.recv()
            kind = msg.get("type")
            if kind == "token":
                yield TokenEvent.from_message(msg)
            elif kind == "done":
                yield TokenEvent(
                    text="",
                    finish_reason=str(msg.get("finish_reason") or "stop"),
                    usage=Usage.from_dict(msg.get("usage")),
                    raw=msg,
                )
                return
            elif kind in _INFO_TYPES:
                continue
            else:
                raise ProtocolError(f"unexpected message during generation: {msg!r}")

    async def say(self, text: str, **params: Any) -> GenerateResult:
        """One turn: append ``text`` (if any), generate, and return the whole reply."""
        if text:
            await self.append(text)
        parts: list[str] = []
        async for ev in self.generate(**params):
            parts.append(ev.text)
            if ev.is_last:
                return GenerateResult("".join(parts), ev.finish_reason or "stop", ev.usage, ev.raw)
        raise ProtocolError("generation ended without 'done'")
