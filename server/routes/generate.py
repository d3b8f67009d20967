"""Text generation over HTTP: `POST /v1/generate` (own format; the OpenAI-compatible
endpoints are in openai_text.py), non-streaming or as Server-Sent Events (sse-starlette).

The prologue (`_open`: limits, model, admission, slot) starts a run whose typed events
(`Token`* then `Done` | `Failed`) the handler reads. Each request is a short-lived session: a slot is
taken, [bos] + prompt bytes are prefilled, tokens are sampled until max tokens, end of text or
a stop string, and the slot is freed (server/sessions/text.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from dlr_runtime.engine import PoolFullError

from ..admission import pool_full, refusal
from ..context import AppContext, CtxDep
from ..errors import NoModelError, api_error
from ..events import Done, Failed, Token
from ..protocol import GenerateRequest, SamplingFields
from ..sessions.text import PromptTooLong, Run, open_generation
from .openai_shared import sse

router = APIRouter()


async def _open(
    ctx: AppContext,
    req: SamplingFields,
    prompt: str,
    model: str | None,
    max_tokens: int,
    max_field: str,
) -> Run | Response:
    """The shared prologue: a running generation, or the error response."""
    s = ctx.settings
    if len(prompt) > s.max_prompt_chars:
        return api_error(
            422,
            f"prompt: longer than {s.max_prompt_chars} characters",
            "validation_error",
            "prompt",
        )
    if max_tokens > s.max_new_tokens:
        return api_error(
            422, f"{max_field}: at most {s.max_new_tokens}", "validation_error", max_field
        )
    try:
        m = ctx.pick_model(model, "lm")
    except NoModelError as e:
        return api_error(404, str(e), "model_not_found", "model")
    r = refusal(ctx, model=m)
    if r is not None:
        return r.response()
    try:
        return await open_generation(ctx, m, prompt, req, max_tokens)
    except PoolFullError:
        return pool_full(ctx, m).response()
    except PromptTooLong as e:
        return api_error(400, str(e), "prompt_too_long", e.field)


def _usage(prompt_tokens: int, completion_tokens: int, total: bool = False) -> dict:
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if total:
        u["total_tokens"] = prompt_tokens + completion_tokens
    return u


async def _collect(run: Run) -> tuple[str, Done] | Failed:
    """A non-streaming generation: the whole text and its `Done`, or its `Failed`."""
    text = []
    async with aclosing(run.events()) as events:  # (closing it frees the slot now)
        async for ev in events:
            match ev:
                case Token(text=piece):
                    text.append(piece)
                case Done(tail=tail):
                    text.append(tail)
                    return "".join(text), ev
                case Failed():
                    return ev
    raise RuntimeError("generation ended without Done or Failed")


@router.post("/v1/generate")
async def generate(req: GenerateRequest, ctx: CtxDep) -> Response:
    run = await _open(ctx, req, req.prompt, req.model, req.max_new_tokens, "max_new_tokens")
    if isinstance(run, Response):
        return run
    name = run.m.name
    if not req.stream:
        match await _collect(run):
            case Failed(message=message):
                return api_error(500, message, "generation_failed")
            case (text, Done(reason=reason, completion_tokens=n)):
                return JSONResponse(
                    {
                        "text": text,
                        "finish_reason": reason,
                        "usage": _usage(run.prompt_tokens, n),
                        "seed": run.seed,
                        "model": name,
                    }
                )

    async def stream() -> AsyncIterator[dict]:
        full, i = [], 0
        async for ev in run.events():
            match ev:
                case Token(id=tid, text=text):
                    full.append(text)
                    yield {
                        "type": "token",
                        "index": i,
                        "token": {"id": tid, "text": text},
                        "text": text,
                    }
                    i += 1
                case Done(reason=reason, tail=tail, completion_tokens=n):
                    full.append(tail)
                    yield {
                        "type": "done",
                        "text": tail,
                        "finish_reason": reason,
                        "usage": _usage(run.prompt_tokens, n),
                        "seed": run.seed,
                        "generated_text": "".join(full),
                    }
                case Failed(message=message):
                    yield {
                        "type": "error",
                        "error": {"message": message, "code": "generation_failed"},
                    }

    return sse(run, stream())
