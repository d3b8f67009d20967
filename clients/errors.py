"""Exceptions raised by the dlr-serve client library.

Every error the server reports (a WebSocket ``{"type": "error", ...}`` message, or an HTTP
error body) becomes a :class:`ServerError` carrying the server's ``code`` string, the HTTP status
or WebSocket close code, and the message, so callers can branch on ``err.code`` instead of
parsing text.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ClientError",
    "ConnectionFailed",
    "Overloaded",
    "ProtocolError",
    "ServerError",
    "Timeout",
    "error_from_http",
]


class ClientError(Exception):
    """Base class of every exception this library raises."""


class ConnectionFailed(ClientError):
    """The server could not be reached, or the connection dropped and could not be resumed."""


class Timeout(ClientError):
    """Connecting, or waiting for the server's next message, took longer than allowed."""


class ProtocolError(ClientError):
    """The server sent something this client does not understand (bad JSON, unknown order)."""


class ServerError(ClientError):
    """The server refused or failed a request and said why.

    Attributes:
        code: the server's snake_case error code (``"invalid_request"``, ``"overloaded"``, ...).
        message: the server's human-readable explanation.
        status: the HTTP status (4xx/5xx) for HTTP calls, else None.
        close_code: the WebSocket close code (1003, 1008, 1009, 1011, 1013, ...), else None.
        retry_after: seconds the server asked to wait before retrying, when it said so.
        details: the raw error body (dict) as the server sent it.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        close_code: int | None = None,
        retry_after: float | None = None,
        details: Any = None,
    ) -> None:
        where = f"HTTP {status}" if status is not None else f"close {close_code}"
        super().__init__(f"[{code}] {message} ({where})")
        self.code = code
        self.message = message
        self.status = status
        self.close_code = close_code
        self.retry_after = retry_after
        self.details = details


class Overloaded(ServerError):
    """The server is at capacity (HTTP 429/503 or close 1013); retry after ``retry_after``."""


def _message_of(body: Any) -> tuple[str | None, str | None]:
    """Pull (code, message) out of the error body shapes the server may use."""
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):  # OpenAI style {"error": {"message", "code"}}
            inner = body["error"]
            return inner.get("code") or inner.get("type"), inner.get("message")
        if "code" in body or "message" in body:  # {"code", "message"}
            return body.get("code"), body.get("message")
        if "detail" in body:  # FastAPI style {"detail": str | [ {loc, msg, type}, ... ]}
            detail = body["detail"]
            if isinstance(detail, list) and detail and isinstance(detail[0], dict):
                parts = []
                for item in detail:
                    loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                    parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg")))
                return "validation_error", "; ".join(parts)
            if isinstance(detail, dict):
                return _message_of(detail)
            return None, str(detail)
    if isinstance(body, str) and body:
        return None, body
    return None, None


def error_from_http(status: int, body: Any, retry_after: str | None = None) -> ServerError:
    """Build the exception for an HTTP error response (status >= 400) and its decoded body."""
    code, message = _message_of(body)
    default_codes = {
        400: "bad_request",
        401: "unauthorized",
        403: "forbidden",
        404: "not_found",
        413: "too_large",
        422: "validation_error",
        429: "overloaded",
        503: "unavailable",
    }
    code = code or default_codes.get(status, "server_error" if status >= 500 else "http_error")
    message = message or f"HTTP {status}"
    wait: float | None = None
    if retry_after:
        try:
            wait = float(retry_after)
        except ValueError:
            wait = None
    cls = Overloaded if status in (429, 503) else ServerError
    return cls(code, message, status=status, retry_after=wait, details=body)


def error_from_ws(msg: dict[str, Any], close_code: int | None = None) -> ServerError:
    """Build the exception for a WebSocket ``{"type": "error"}`` message."""
    code = str(msg.get("code") or "server_error")
    message = str(msg.get("message") or code)
    retry = msg.get("retry_after_s", msg.get("retry_after"))
    retry_after = float(retry) if isinstance(retry, int | float) else None
    cls = (
        Overloaded
        if close_code == 1013 or code in ("overloaded", "too_many_sessions")
        else ServerError
    )
    return cls(code, message, close_code=close_code, retry_after=retry_after, details=msg)
