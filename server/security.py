"""API keys and browser-origin checks, as one ASGI middleware.

- API keys (`api_keys` setting, comma-separated): when set, every HTTP and WebSocket endpoint
  except `/healthz`, `/readyz`, `/metrics` and the static browser page needs one, as
  `Authorization: Bearer <key>` or, for WebSockets (browsers cannot set headers), as a
  subprotocol `bearer.<key>`. The handshake's answer names `dlr.v1` when it was offered (or
  another offered protocol), never a `bearer.` one: the key is never echoed back. Keys are
  compared with `hmac.compare_digest` over their sha256 (constant time, independent of the key
  length). Refusals: HTTP 401 JSON with `WWW-Authenticate`; WebSocket handshakes get an HTTP
  401 JSON response (close 1008 where the server cannot send one).
- Origins (server/origin.py): a WebSocket handshake, or a state-changing HTTP request (POST,
  PUT, PATCH, DELETE), whose `Origin` is not allowed is refused with 403 `forbidden_origin`
  (cross-site requests, cross-site WebSocket hijacking, DNS rebinding). HTTP CORS for the
  `cors_origins` list is Starlette's `CORSMiddleware` (added by `create_app`). No `Origin`
  (non-browser clients) is always accepted.

Request-body limits (size, read deadline, text) are server/limits.py.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import asgi_error, asgi_ws_refuse
from .origin import OriginPolicy
from .settings import Settings

PUBLIC_PATHS = {"/healthz", "/readyz", "/metrics"}
API_PREFIXES = ("/v1/", "/docs", "/redoc", "/openapi.json")
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
AUTHENTICATE = [(b"www-authenticate", b'Bearer realm="dlr-serve"')]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class Security:
    """The ASGI middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.keys = [_digest(k) for k in settings.key_list()]
        self.policy = OriginPolicy.of(settings)

    # ------------------------------------------------------------------ checks
    def key_ok(self, token: str | None) -> bool:
        if token is None:
            return False
        d = _digest(token)
        ok = False
        for k in self.keys:  # every key compared: time independent of which one matches
            ok |= hmac.compare_digest(d, k)
        return ok

    def needs_key(self, path: str) -> bool:
        return bool(self.keys) and path not in PUBLIC_PATHS and path.startswith(API_PREFIXES)

    def origin_ok(self, headers: dict[str, str]) -> bool:
        return self.policy.origin_ok(headers.get("origin"), headers.get("host", ""))

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope.get("path", "")
        if scope["type"] == "websocket":
            return await self._websocket(scope, receive, send, headers, path)
        if scope.get("method") not in SAFE_METHODS and not self.origin_ok(headers):
            return await asgi_error(send, 403, "origin not allowed", "forbidden_origin")
        if self.needs_key(path) and scope.get("method") != "OPTIONS":
            auth = headers.get("authorization", "")
            token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
            if not self.key_ok(token):
                return await asgi_error(
                    send, 401, "missing or invalid API key", "unauthorized", None, AUTHENTICATE
                )
        return await self.app(scope, receive, send)

    async def _websocket(self, scope, receive, send, headers, path) -> None:
        offered = [
            p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()
        ]
        bearer = next((p for p in offered if p.startswith("bearer.")), None)
        names = [p for p in offered if not p.startswith("bearer.")]  # (never echo a key)
        if names:
            scope["dlr.subprotocol"] = "dlr.v1" if "dlr.v1" in names else names[0]
        if not self.origin_ok(headers):
            return await asgi_ws_refuse(
                scope, receive, send, 403, "origin not allowed", "forbidden_origin"
            )
        if self.needs_key(path):
            auth = headers.get("authorization", "")
            token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
            if token is None and bearer is not None:
                token = bearer[len("bearer.") :]
            if not self.key_ok(token):
                return await asgi_ws_refuse(
                    scope, receive, send, 401, "missing or invalid API key", "unauthorized"
                )
        return await self.app(scope, receive, send)
