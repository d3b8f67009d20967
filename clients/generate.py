"""HTTP client (async): text generation, models, health.

Usage::

    async with AsyncGenerateClient("http://127.0.0.1:8000") as client:
        result = await client.generate("To be", max_new_tokens=32, temperature=0)
        async for event in client.generate_stream("To be", max_new_tokens=32):
            print(event.text, end="", flush=True)

``generate`` posts to ``POST /v1/generate``; ``generate_stream`` posts with ``"stream": true``
and reads the Server-Sent Events (httpx-sse), one :class:`~clients.types.TokenEvent` per token,
the last one carrying ``finish_reason`` and usage. A request that could not reach the server
(connection refused, connect timeout) is retried with backoff by httpx's transport
(``max_reconnects`` times); a request the server answered is never sent twice, except on
429/503 with ``retry_overloaded=True`` (after the server's Retry-After).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from httpx_sse import EventSource

from clients._ws import ClientBase
from clients.errors import (
    ConnectionFailed,
    Overloaded,
    ProtocolError,
    ServerError,
    Timeout,
    error_from_http,
)
from clients.types import GenerateResult, ModelInfo, TokenEvent

__all__ = ["AsyncGenerateClient", "sampling_body"]


def sampling_body(
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: list[str] | str | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """The sampling fields shared by ``/v1/generate`` and the chat ``generate`` message.

    Fields left as None are omitted, so the server's defaults apply.
    """
    body: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seed": seed,
        "stop": [stop] if isinstance(stop, str) else stop,
        "model": model,
    }
    return {k: v for k, v in body.items() if v is not None}


def _json_or_text(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return resp.text


class AsyncGenerateClient(ClientBase):
    """Async client of the server's HTTP endpoints; use as an async context manager.

    Keyword arguments: those of :class:`~clients._ws.ClientBase`, and ``retry_overloaded``
    (retry 429/503 answers after their Retry-After).
    """

    def __init__(
        self, base_url: str = "http://127.0.0.1:8000", *, retry_overloaded: bool = False, **kw: Any
    ) -> None:
        super().__init__(base_url, **kw)
        self.retry_overloaded = retry_overloaded
        timeout = httpx.Timeout(self.cfg.read_timeout, connect=self.cfg.connect_timeout)
        self._http = httpx.AsyncClient(
            base_url=self.cfg.base_url.rstrip("/"),
            headers=self.cfg.headers(),
            timeout=timeout,
            transport=httpx.AsyncHTTPTransport(retries=self.cfg.max_reconnects),
        )

    async def __aenter__(self) -> AsyncGenerateClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ plumbing
    async def _send(
        self, method: str, path: str, *, stream: bool = False, **kw: Any
    ) -> httpx.Response:
        """Send a request (connect failures are retried by the transport); retry 429/503 only
        when allowed."""
        attempt = 0
        while True:
            try:
                req = self._http.build_request(method, path, **kw)
                resp = await self._http.send(req, stream=stream)
            except httpx.ConnectTimeout as exc:
                raise Timeout(f"connecting to {self.cfg.base_url} timed out") from exc
            except httpx.ConnectError as exc:
                raise ConnectionFailed(f"cannot connect to {self.cfg.base_url}: {exc}") from exc
            except httpx.TimeoutException as exc:
                raise Timeout(
                    f"{method} {path}: no answer within {self.cfg.read_timeout} s"
                ) from exc
            except httpx.TransportError as exc:
                raise ConnectionFailed(f"{method} {path}: {exc}") from exc
            if resp.status_code < 400:
                return resp
            if stream:
                await resp.aread()
            err = error_from_http(
                resp.status_code, _json_or_text(resp), resp.headers.get("Retry-After")
            )
            if stream:
                await resp.aclose()
            if (
                isinstance(err, Overloaded)
                and self.retry_overloaded
                and attempt < self.cfg.max_reconnects
            ):
                attempt += 1
                await asyncio.sleep(min(err.retry_after or 1.0, 30.0))
                continue
            raise err

    async def _get_json(self, path: str) -> Any:
        resp = await self._send("GET", path)
        return _json_or_text(resp)

    # ------------------------------------------------------------------ endpoints
    async def health(self) -> bool:
        """True when ``/healthz`` answers 2xx."""
        await self._send("GET", "/healthz")
        return True

    async def ready(self) -> bool:
        """True when ``/readyz`` answers 2xx, False when it answers 503."""
        try:
            await self._send("GET", "/readyz")
        except ServerError as exc:
            if exc.status == 503:
                return False
            raise
        return True

    async def models(self) -> list[ModelInfo]:
        """The served models (``GET /v1/models``)."""
        body = await self._get_json("/v1/models")
        items = body.get("data", body.get("models")) if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise ProtocolError(f"unexpected /v1/models body: {body!r}")
        return [ModelInfo.from_dict(m) for m in items]

    async def generate(self, prompt: str, **params: Any) -> GenerateResult:
        """Generate a continuation of ``prompt`` and return it whole."""
        body = {
            "prompt": prompt,
            "stream": False,
            **sampling_body(**{"model": self.model, **params}),
        }
        resp = await self._send("POST", "/v1/generate", json=body)
        data = _json_or_text(resp)
        if not isinstance(data, dict):
            raise ProtocolError(f"unexpected /v1/generate body: {data!r}")
        return GenerateResult.from_message(data)

    async def generate_stream(self, prompt: str, **params: Any) -> AsyncIterator[TokenEvent]:
        """Generate with ``stream: true``: yield one event per token as the server sends it."""
        body = {
            "prompt": prompt,
            "stream": True,
            **sampling_body(**{"model": self.model, **params}),
        }
        resp = await self._send("POST", "/v1/generate", json=body, stream=True)
        try:
            async for sse in EventSource(resp).aiter_sse():
                event, data = sse.event, sse.data
                if data == "[DONE]":
                    return
                try:
                    msg = json.loads(data)
                except ValueError as exc:
                    raise ProtocolError(f"bad SSE data: {data[:200]!r}") from exc
                if event == "error" or (isinstance(msg, dict) and "error" in msg):
                    inner = msg.get("error", msg) if isinstance(msg, dict) else {}
                    inner = inner if isinstance(inner, dict) else {"message": str(inner)}
                    raise ServerError(
                        str(inner.get("code") or "generation_failed"),
                        str(inner.get("message") or inner),
                        status=resp.status_code,
                        details=msg,
                    )
                ev = TokenEvent.from_message(msg)
                yield ev
                if ev.is_last:
                    return
        except httpx.TimeoutException as exc:
            raise Timeout(f"no token within {self.cfg.read_timeout} s") from exc
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"stream broke: {exc}") from exc
        finally:
            await resp.aclose()
