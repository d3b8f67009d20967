"""Persistent text session over ``WS /v1/generate/stream`` (async).

The session's recurrent state lives on the server: ``append`` feeds text into it, ``generate``
streams new tokens that also stay in it, so each turn sends only the new text::

    async with AsyncChatSession("http://127.0.0.1:8000") as chat:
        await chat.append("Q: Who is Hamlet?\\nA:")
        async for event in chat.generate(max_new_tokens=40, stop=["\\n"]):
            print(event.text, end="", flush=True)

If the connection drops (between turns or in the middle of a generation) and the server gave a
resume token, the client reconnects and resumes the same session: the messages the server had
not received are sent again, and the tokens missed meanwhile are replayed by the server (each
server message is numbered, so none is delivered twice).

When the server keeps durable checkpoints (its ``ready`` says ``"checkpoints": true``), a
session also survives a crash of the server: messages are kept until a ``checkpoint`` message
says the stored state has them, and after a resume on a restarted server (or another replica)
the messages after that checkpoint are sent again. A generation the server redoes after a
crash repeats exactly when it is seeded (``seed``) or greedy (``temperature=0``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from clients._ws import ClientBase, Disconnected, Resumable, WSConnection
from clients.errors import ConnectionFailed, ProtocolError
from clients.generate import sampling_body
from clients.types import GenerateResult, TokenEvent, Usage

__all__ = ["CHAT_PATH", "AsyncChatSession"]

CHAT_PATH = "/v1/generate/stream"
_INFO_TYPES = ("appended", "ack", "ping", "pong", "info", "warning", "ready", "going_away")


class AsyncChatSession(ClientBase):
    """One server-side text session; use as an async context manager.

    Keyword arguments: those of :class:`~clients._ws.ClientBase` (model, api_key, timeouts, ...).
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self._conn: WSConnection | None = None
        self._live = Resumable(self.cfg, CHAT_PATH)
        self._acked = 0  # append/generate messages the server surely has (before the last done,
        # or, with durable checkpoints, in the last checkpoint)
        self._durable = False  # the server's ready said "checkpoints": true
        self._unacked: list[dict[str, Any]] = []  # messages sent after those, kept for resends
        self.ready_info: dict[str, Any] = {}
        self.reconnects = 0

    @property
    def session_id(self) -> str | None:
        return self._live.session_id

    @property
    def resume_token(self) -> str | None:
        return self._live.token

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
        self._live.started(ready)
        self._acked, self._unacked = 0, []
        self._durable = bool(ready.get("checkpoints"))

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _recover(self, exc: Disconnected) -> None:
        """Resume after a drop (or re-raise); re-send the messages the server did not get."""
        self._live.check(exc)
        if self._conn is not None:
            await self._conn.close()
        self._conn, ready = await self._live.resume()
        self.reconnects += 1
        received = ready.get("messages_received")
        start = received - self._acked if isinstance(received, int) else 0
        for msg in self._unacked[max(0, start) :]:
            await self._conn.send_json(msg)

    async def _send(self, msg: dict[str, Any]) -> None:
        """Send one message (kept until a ``done`` proves it arrived); resume if the link is down."""
        if self._conn is None:
            raise ConnectionFailed("session is closed; call open()")
        self._unacked.append(msg)
        try:
            await self._conn.send_json(msg)
        except Disconnected as exc:
            await self._recover(exc)  # re-sends msg unless the server had it

    async def _recv(self) -> dict[str, Any]:
        """Next new message of the session, resuming across drops."""
        while True:
            assert self._conn is not None
            try:
                msg = await self._conn.recv()
            except Disconnected as exc:
                await self._recover(exc)
                continue
            if msg.get("type") == "checkpoint":  # the stored state has the first n messages
                self._checkpointed(msg.get("messages_received"))
                continue
            if self._live.fresh(msg):
                return msg

    def _checkpointed(self, n: Any) -> None:
        if isinstance(n, int) and n > self._acked:
            del self._unacked[: n - self._acked]
            self._acked = n

    async def append(self, text: str) -> None:
        """Feed ``text`` into the session's state (prefill); no tokens are generated."""
        await self._send({"type": "append", "text": text})

    async def generate(self, **params: Any) -> AsyncIterator[TokenEvent]:
        """Generate from the current state; yields token events, the last with finish_reason.

        Parameters are those of ``/v1/generate``: max_new_tokens, temperature, top_k, top_p,
        seed, stop.
        """
        await self._send({"type": "generate", **sampling_body(**params)})
        while True:
            msg = await self._recv()
            kind = msg.get("type")
            if kind == "token":
                yield TokenEvent.from_message(msg)
            elif kind == "done":
                if not self._durable:  # (durable: kept until a checkpoint has them)
                    self._acked += len(self._unacked)  # the server has every message up to here
                    self._unacked = []
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
