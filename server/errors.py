"""Error bodies and WebSocket close codes shared by the routes.

HTTP errors use the OpenAI shape {"error": {"message", "type", "code", "param"}} (validation
errors also keep FastAPI's "detail" list); WebSocket errors are
{"type": "error", "code": <snake_case>, "message": ...} followed by a close with `WS_CLOSE[code]`.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

# WebSocket close code per error code
WS_CLOSE = {
    "invalid_json": 1003,
    "invalid_audio": 1003,
    "invalid_text": 1007,  # (a lone surrogate: not valid Unicode text)
    "invalid_message": 1008,
    "no_session": 1008,
    "unknown_model": 1008,
    "busy": 1008,
    "idle_timeout": 1008,
    "frame_too_big": 1009,
    "internal_error": 1011,
    "overloaded": 1013,
    "queue_full": 1013,
    "invalid_resume": 1008,
    "unauthorized": 1008,
    "going_away": 1001,
}


def error_body(message: str, code: str, type_: str = "invalid_request_error", param=None) -> dict:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def api_error(
    status: int, message: str, code: str, param: str | None = None, headers: dict | None = None
) -> JSONResponse:
    type_ = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        type_ = "overloaded_error"
    return JSONResponse(
        error_body(message, code, type_, param), status_code=status, headers=headers
    )


async def asgi_error(
    send, status: int, message: str, code: str, param: str | None = None, extra_headers=()
) -> None:
    """An HTTP error response sent by an ASGI middleware (before any route ran)."""
    body = json.dumps(error_body(message, code, param=param)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def asgi_ws_refuse(
    scope, receive, send, status: int, message: str, code: str, close_code: int = 1008
) -> None:
    """Refuse a WebSocket handshake: an HTTP `status` JSON answer where the server supports
    it, else a close with `close_code`."""
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json.dumps(error_body(message, code)).encode()
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": close_code, "reason": code})


def field_name(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


async def validation_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    errs = exc.errors()
    first = errs[0] if errs else {"loc": ("body",), "msg": "invalid request"}
    param = field_name(tuple(first.get("loc", ())))
    body = error_body(f"{param}: {first.get('msg')}", "validation_error", param=param)
    body["detail"] = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in errs
    ]
    return JSONResponse(body, status_code=422)


def validation_message(exc: Exception) -> tuple[str, str]:
    """(field, message) of a pydantic ValidationError, for WebSocket error messages."""
    errs = getattr(exc, "errors", lambda: [])()
    if errs:
        param = field_name(tuple(errs[0].get("loc", ())))
        return param, f"{param}: {errs[0].get('msg')}"
    return "", str(exc)


class NoModelError(LookupError):
    """The requested model does not exist (or no model of the needed kind is loaded)."""


class Closed(Exception):
    """A WebSocket connection is over. `by_client`: the peer left (close code `code`, 1006 when
    the link just dropped); otherwise the server closed it after an error (str(self) = the code)."""

    def __init__(self, reason: str = "", by_client: bool = False, code: int | None = None):
        super().__init__(reason)
        self.by_client, self.code = by_client, code

    @property
    def resumable(self) -> bool:
        """A drop that keeps the session for resume (anything but a clean close)."""
        return self.by_client and self.code != 1000
