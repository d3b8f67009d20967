"""The one admission policy: may new work start now?

`refusal(ctx, model=None, kind=None) -> Refusal | None` is asked by every entry point before it
takes a slot: HTTP generation and session import answer `r.response()` (429, or 503 while
draining, with `Retry-After`), a WebSocket answers `raise await conn.refuse(r)` (error
`overloaded` + close 1013 with `retry_after_s`). Checks, in order:

1. the server is draining (SIGTERM);
2. the server-wide cap `max_total_sessions` (0 = none) is reached;
3. the model's own cap `max_sessions` is reached (per model: text sessions never take speech
   slots); with only `kind` known (a WebSocket handshake, before `start` names the model), every
   model of that kind is full;
4. too much work is queued (`max_total_queued_audio_s`, `max_queued_requests`).

A refusal counts in `dlr_rejections_total{reason}`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import JSONResponse

from .context import AppContext
from .errors import api_error
from .registry import ModelEntry


@dataclass(frozen=True)
class Refusal:
    reason: str  # metric label: draining | sessions_full | pool_full | queue_full
    message: str
    retry_after_s: int
    status: int = 429  # HTTP status
    code: str = "overloaded"  # HTTP error code (WebSockets always say "overloaded")

    def response(self) -> JSONResponse:
        return api_error(
            self.status, self.message, self.code, headers={"Retry-After": str(self.retry_after_s)}
        )


def model_full(ctx: AppContext, m: ModelEntry) -> bool:
    return m.sessions >= ctx.settings.max_sessions


def refusal(
    ctx: AppContext, model: ModelEntry | None = None, kind: str | None = None
) -> Refusal | None:
    """Why new work is refused now (see the module docstring), or None to admit it."""
    r = _check(ctx, model, kind)
    if r is not None:
        ctx.metrics.rejections.labels(r.reason).inc()
    return r


def pool_full(ctx: AppContext, m: ModelEntry) -> Refusal:
    """The refusal when a model's state pool had no free slot after all."""
    ctx.metrics.rejections.labels("pool_full").inc()
    return Refusal(
        "pool_full", f"model {m.name!r} has no free session slot; retry later", _after(ctx)
    )


def _after(ctx: AppContext) -> int:
    return ctx.settings.retry_after_s


def _check(ctx: AppContext, model: ModelEntry | None, kind: str | None) -> Refusal | None:
    s = ctx.settings
    if ctx.draining:
        return Refusal(
            "draining",
            "the server is shutting down; connect again (another replica) shortly",
            _after(ctx),
            status=503,
            code="draining",
        )
    if s.max_total_sessions and ctx.sessions >= s.max_total_sessions:
        return Refusal(
            "sessions_full",
            f"the server is at its session limit (max_total_sessions={s.max_total_sessions}); "
            "retry later",
            _after(ctx),
        )
    if model is not None:
        full = model_full(ctx, model)
    elif kind is not None:
        of_kind = [m for m in ctx.models.values() if m.kind == kind]
        full = bool(of_kind) and all(model_full(ctx, m) for m in of_kind)
    else:
        full = False
    if full:
        name = f"model {model.name!r}" if model is not None else f"every {kind} model"
        return Refusal(
            "sessions_full",
            f"{name} is at its session limit (max_sessions={s.max_sessions}); retry later",
            _after(ctx),
        )
    why = ctx.queue_overload()
    if why:
        return Refusal("queue_full", f"{why}; retry later", _after(ctx))
    return None
