"""One WebSocket connection to the server with timeouts and error mapping.

:class:`WSConnection` turns the server's conventions into exceptions: a ``{"type": "error"}``
message becomes :class:`~clients.errors.ServerError` (with the close code that follows it), a
refused handshake becomes the matching HTTP error, a dropped connection becomes
:class:`Disconnected` (which callers holding a resume token may recover from), and a silent
server becomes :class:`~clients.errors.Timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from clients.errors import (
    ConnectionFailed,
    Overloaded,
    ProtocolError,
    ServerError,
    Timeout,
    error_from_http,
    error_from_ws,
)

__all__ = [
    "RESUMABLE_CLOSE_CODES",
    "ClientBase",
    "ClientConfig",
    "Disconnected",
    "Resumable",
    "WSConnection",
    "ws_url",
]

#: close codes after which a session may be resumed with its resume token: going away (server
#: restart or drain), abnormal closure (network drop), service restart, try again later.
RESUMABLE_CLOSE_CODES = frozenset({1001, 1006, 1012, 1013})


@dataclass
class ClientConfig:
    """Where the server is and how patient to be with it."""

    base_url: str = "http://127.0.0.1:8000"  # http(s)://host:port of the server
    api_key: str | None = None  # sent as "Authorization: Bearer <key>" when set
    connect_timeout: float = 10.0  # seconds for TCP + HTTP/WebSocket handshake
    read_timeout: float = 60.0  # seconds to wait for the server's next message
    max_reconnects: int = 3  # resumes of one session after drops (0 = never resume)
    reconnect_backoff: float = 0.5  # first wait before a reconnect; doubles up to 4 s
    resume_timeout: float = 60.0  # keep trying to resume this long (a restarting server)
    max_message_bytes: int = 16 * 1024 * 1024  # largest message accepted from the server

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


class ClientBase:
    """Constructor shared by the clients: where the server is, which model, how patient."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        model: str | None = None,
        api_key: str | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_reconnects: int = 3,
        resume_timeout: float = 60.0,
        config: ClientConfig | None = None,
    ) -> None:
        self.cfg = config or ClientConfig(
            base_url=base_url,
            api_key=api_key,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_reconnects=max_reconnects,
            resume_timeout=resume_timeout,
        )
        self.model = model  # None: the server's first model of the needed kind


def ws_url(base_url: str, path: str) -> str:
    """``http://h:p`` + ``/v1/x`` -> ``ws://h:p/v1/x`` (https -> wss); ws(s) URLs pass through."""
    base = base_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    elif not base.startswith(("ws://", "wss://")):
        base = "ws://" + base
    return base + path


class Disconnected(ConnectionFailed):
    """The connection closed while a session was live (``close_code`` says how)."""

    def __init__(self, message: str, close_code: int | None, reason: str = "") -> None:
        super().__init__(message)
        self.close_code = close_code
        self.reason = reason

    @property
    def resumable(self) -> bool:
        return self.close_code in RESUMABLE_CLOSE_CODES or self.close_code is None


class WSConnection:
    """A JSON/binary WebSocket connection speaking the server's message conventions."""

    def __init__(self, cfg: ClientConfig, path: str) -> None:
        self.cfg = cfg
        self.url = ws_url(cfg.base_url, path)
        self._ws: Any = None

    @property
    def is_open(self) -> bool:
        return self._ws is not None and self._ws.close_code is None

    async def open(self) -> None:
        """Connect; raises ConnectionFailed, Timeout or the server's refusal as ServerError."""
        try:
            self._ws = await asyncio.wait_for(
                websockets.connect(
                    self.url,
                    additional_headers=self.cfg.headers(),
                    max_size=self.cfg.max_message_bytes,
                    open_timeout=self.cfg.connect_timeout,
                    ping_interval=20,
                    ping_timeout=max(20.0, self.cfg.read_timeout),
                ),
                timeout=self.cfg.connect_timeout + 1.0,
            )
        except InvalidStatus as exc:
            resp = exc.response
            try:
                body: Any = json.loads(resp.body.decode()) if resp.body else None
            except (ValueError, UnicodeDecodeError):
                body = resp.body.decode(errors="replace") if resp.body else None
            raise error_from_http(resp.status_code, body, resp.headers.get("Retry-After")) from exc
        except TimeoutError as exc:
            raise Timeout(
                f"connecting to {self.url} took over {self.cfg.connect_timeout} s"
            ) from exc
        except (OSError, InvalidHandshake) as exc:
            raise ConnectionFailed(f"cannot connect to {self.url}: {exc}") from exc

    async def send_json(self, msg: dict[str, Any]) -> None:
        await self._send(json.dumps(msg))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(data)

    async def _send(self, data: str | bytes) -> None:
        if self._ws is None:
            raise ConnectionFailed("not connected")
        try:
            await self._ws.send(data)
        except ConnectionClosed as exc:
            raise self._closed(exc) from exc

    def _closed(self, exc: ConnectionClosed) -> Exception:
        rcvd = exc.rcvd
        code = rcvd.code if rcvd is not None else None
        reason = rcvd.reason if rcvd is not None else ""
        if code == 1013:
            return Overloaded(
                "overloaded", reason or "server overloaded (close 1013)", close_code=code
            )
        if code in (1003, 1007, 1008, 1009, 1011) and code is not None:
            return ServerError("closed", reason or f"server closed with {code}", close_code=code)
        return Disconnected(f"connection closed (code {code}) {reason}".strip(), code, reason)

    async def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """Next JSON message; raises ServerError for an error message, Disconnected on close."""
        if self._ws is None:
            raise ConnectionFailed("not connected")
        wait = self.cfg.read_timeout if timeout is None else timeout
        try:
            raw = await asyncio.wait_for(self._ws.recv(), timeout=wait)
        except TimeoutError as exc:
            raise Timeout(f"no message from {self.url} within {wait} s") from exc
        except ConnectionClosed as exc:
            raise self._closed(exc) from exc
        if isinstance(raw, bytes):
            raise ProtocolError(f"unexpected binary message of {len(raw)} bytes")
        try:
            msg = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"server sent invalid JSON: {raw[:200]!r}") from exc
        if not isinstance(msg, dict) or "type" not in msg:
            raise ProtocolError(f"server message without a type: {raw[:200]!r}")
        if msg["type"] == "error":
            raise error_from_ws(msg, await self._close_code_after_error())
        return msg

    async def _close_code_after_error(self) -> int | None:
        """The server closes right after an error message; wait briefly to learn the code."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._ws.wait_closed(), timeout=1.0)
        return self._ws.close_code

    async def close(self, code: int = 1000) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(code=code), timeout=2.0)
            self._ws = None


class Resumable:
    """What a session needs to survive a dropped connection: id, resume token, message order.

    Server messages after ``ready`` carry ``seq`` (1, 2, ...); :meth:`fresh` drops the ones a
    resume replays twice. ``going_away`` (the server is stopping) says whether to resume.
    """

    def __init__(self, cfg: ClientConfig, path: str) -> None:
        self.cfg, self.path = cfg, path
        self.session_id: str | None = None
        self.token: str | None = None
        self.last_seq = 0
        self.going_away: dict[str, Any] | None = None
        self.resumes = 0  # resumes of the current session

    def started(self, ready: dict[str, Any]) -> None:
        """A new session began (``ready`` after ``start``)."""
        self.session_id = ready.get("session_id")
        self.token = ready.get("resume_token")
        self.last_seq, self.going_away, self.resumes = 0, None, 0

    def fresh(self, msg: dict[str, Any]) -> bool:
        """False for a message already seen (replayed after a resume); records ``going_away``."""
        seq = msg.get("seq")
        if isinstance(seq, int):
            if seq <= self.last_seq:
                return False
            self.last_seq = seq
        if msg.get("type") == "going_away":
            self.going_away = msg
        return True

    def check(self, exc: Disconnected) -> None:
        """Re-raise ``exc`` (or the server's going-away reason) when it cannot be resumed."""
        if self.going_away is not None and not self.going_away.get("resume", False):
            raise Disconnected(
                f"server going away: {self.going_away.get('message', '')}", exc.close_code
            ) from exc
        if not (exc.resumable and self.token and self.resumes < self.cfg.max_reconnects):
            raise exc

    async def resume(self) -> tuple[WSConnection, dict[str, Any]]:
        """Reconnect and send ``resume`` until the server answers ``ready`` (or time is up)."""
        self.resumes += 1
        wait = self.cfg.reconnect_backoff
        if self.going_away is not None:
            wait = max(wait, float(self.going_away.get("retry_after_s") or 0))
        self.going_away = None
        deadline = time.monotonic() + self.cfg.resume_timeout
        while True:
            await asyncio.sleep(wait)
            conn = WSConnection(self.cfg, self.path)
            try:
                await conn.open()
                await conn.send_json(
                    {
                        "type": "resume",
                        "session_id": self.session_id,
                        "resume_token": self.token,
                        "last_seq": self.last_seq,
                    }
                )
                ready = await conn.recv()
                if ready.get("type") == "error" and ready.get("code") == "overloaded":
                    # (a draining or full replica; through a load balancer the next try
                    # may reach another one)
                    raise ConnectionFailed(f"server refused the resume: {ready.get('message')}")
            except (ConnectionFailed, Timeout, Overloaded) as exc:
                # not back yet, or refused for now (HTTP 429/503 from the server or a load
                # balancer in front of it, close 1013): wait (Retry-After when given), retry
                await conn.close()
                wait = _next_wait(wait, exc)
                if time.monotonic() + wait > deadline:
                    raise ConnectionFailed(
                        f"could not resume session {self.session_id} within "
                        f"{self.cfg.resume_timeout:g} s: {exc}"
                    ) from exc
                continue
            if ready.get("type") != "ready":
                raise ProtocolError(f"expected 'ready' after 'resume', got {ready!r}")
            self.token = ready.get("resume_token", self.token)
            return conn, ready


def _next_wait(wait: float, exc: Exception) -> float:
    """The wait before the next resume attempt: doubled up to 4 s, or the server's
    Retry-After when it asked for one (capped at 30 s)."""
    retry_after = getattr(exc, "retry_after", None)
    if isinstance(exc, Overloaded) and retry_after is not None:
        return min(max(float(retry_after), 0.05), 30.0)
    return min(wait * 2, 4.0)
