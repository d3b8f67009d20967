"""Helpers shared by the text routes (openai_text.py, responses.py; `sse` also generate.py):
model pick and admission, settings limits of a job, starting its choices, SSE framing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi.responses import Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from dlr_runtime.engine import PoolFullError, SnapshotError

from ..admission import pool_full, refusal
from ..chat_template import ChatTemplate
from ..context import AppContext
from ..errors import NoModelError, api_error
from ..events import Failed
from ..jsonsafe import dumps
from ..openai_protocol import TextJob, UnsupportedField
from ..registry import ModelEntry
from ..sessions.choices import Choices, StartState, open_choices

PING_S = 15  # SSE keep-alive comment interval


def pick(ctx: AppContext, model: str | None) -> ModelEntry | Response:
    try:
        m = ctx.pick_model(model, "lm")
    except NoModelError as e:
        return api_error(404, str(e), "model_not_found", "model")
    r = refusal(ctx, model=m)
    return m if r is None else r.response()


def check_limits(ctx: AppContext, job: TextJob, max_field: str) -> Response | None:
    s = ctx.settings
    if len(job.prompt_text) > s.max_prompt_chars:
        return api_error(
            422, f"prompt: longer than {s.max_prompt_chars} characters", "validation_error"
        )
    if any(p.max_tokens > s.max_new_tokens for p in job.sampling):
        return api_error(
            422, f"{max_field}: at most {s.max_new_tokens}", "validation_error", max_field
        )
    return None


def template(m: ModelEntry) -> ChatTemplate:
    return ChatTemplate.from_metadata(m.metadata)


async def open_job(
    ctx: AppContext,
    model: str | None,
    make_job: Callable[[ModelEntry], TextJob],
    max_field: str,
    state: StartState | None = None,
) -> tuple[ModelEntry, TextJob, Choices] | Response:
    """The prologue of every OpenAI text route: the model and admission, the request as a job
    (400 for an unsupported field, 422 past the settings' limits), its choices started."""
    m = pick(ctx, model)
    if isinstance(m, Response):
        return m
    try:
        job = make_job(m)
    except UnsupportedField as e:
        return e.response()
    bad = check_limits(ctx, job, max_field)
    if bad is not None:
        return bad
    ch = await start(ctx, m, job, state)
    return ch if isinstance(ch, Response) else (m, job, ch)


async def start(
    ctx: AppContext, m: ModelEntry, job: TextJob, start: StartState | None = None
) -> Choices | Response:
    try:
        ch = await open_choices(ctx, m, job, start)
    except PoolFullError:
        return pool_full(ctx, m).response()
    except SnapshotError as e:  # a stored state of another configuration of the model
        return api_error(409, f"the stored state cannot be continued: {e}", "state_mismatch")
    if isinstance(ch, Failed):
        return api_error(500, ch.message, "generation_failed")
    return ch


def sse(owner: Any, events: AsyncIterator[dict | str | ServerSentEvent]) -> EventSourceResponse:
    """Each dict is sent as JSON data, a str as is (`[DONE]`), a ServerSentEvent as built;
    `owner.close()` (what holds the slots: `Choices`, a generate `Run`) runs when it ends."""

    async def gen() -> AsyncIterator[str | ServerSentEvent]:
        async with aclosing(events):
            async for ev in events:
                yield dumps(ev) if isinstance(ev, dict) else ev

    return EventSourceResponse(
        gen(),
        ping=PING_S,
        sep="\n",
        headers={"Cache-Control": "no-cache"},
        background=BackgroundTask(owner.close),  # (also when the client left before the end)
    )


def finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def error_chunk(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "code": "generation_failed"}}
