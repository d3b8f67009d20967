"""The stateful conversation API in the shape of OpenAI's Responses API.

- `POST /v1/responses` (`input`, `instructions`, `previous_response_id`, `store`, `stream`,
  `max_output_tokens`, sampling fields): the first turn prefills `[bos] + rendered input`
  through the prefix cache; a follow-up restores the stored state of `previous_response_id`
  and feeds only its new input (server/sessions/responses.py), so its cost does not grow with
  the conversation. With `store` (default true) the state after the reply is kept for
  `response_ttl_s` under the response id. Streaming sends the Responses events
  (`response.created` ... `response.output_text.delta` ... `response.completed`).
- `GET /v1/responses/{id}`: the stored response object; `DELETE /v1/responses/{id}`.
- `POST /v1/prefixes` (`model`, `prompt` or `messages`): prefill a prefix and pin its state in
  the model's prefix cache (never evicted), e.g. a long system prompt shared by many requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sse_starlette import ServerSentEvent

from dlr_runtime.engine import PoolFullError
from dlr_runtime.engine.cached_prefill import pin_prefix
from dlr_runtime.engine.prefix_cache import PrefixCacheFull

from ..admission import pool_full
from ..context import AppContext, CtxDep
from ..errors import api_error
from ..events import Done, Failed, Token
from ..openai_objects import ResponseDeleted, ResponseObject, ResponseStream, ResponseUsage
from ..openai_protocol import ChatMessageIn, ResponsesRequest, UnsupportedField
from ..sessions import responses as stored
from ..sessions.choices import Choices
from .openai_shared import open_job, pick, sse, template

router = APIRouter()


def _not_found(response_id: str) -> JSONResponse:
    return api_error(
        404, f"response {response_id!r} not found (unknown, expired or deleted)", "not_found"
    )


async def _turn(
    ctx: AppContext, ch: Choices, resp: ResponseObject, store: bool
) -> AsyncIterator[Any]:
    """The events of one turn (ResponseStream events; a Failed ends it); the stored state is
    written before the final event, so a follow-up sent on it always finds it."""
    st, text = ResponseStream(resp), []
    for ev in st.opening():
        yield ev
    async for _, ev in ch.events():
        match ev:
            case Token(text=piece) if piece:
                text.append(piece)
                yield st.delta(piece)
            case Done(reason=reason, tail=tail, completion_tokens=n):
                if tail:
                    text.append(tail)
                    yield st.delta(tail)
                resp.set_text("".join(text), "length" if reason == "length" else "stop")
                resp.usage = ResponseUsage.of(ch.prompt_tokens, n, ch.cached_tokens)
                if store:
                    sess = ch.sessions[0]
                    body = resp.model_dump(mode="json")
                    blob = await ch.m.scheduler.snapshot(
                        sess.slot, lambda s=sess, b=body: stored.extra_of(s.pending, b)
                    )
                    await stored.save(ctx, ch.m, resp.id, blob)
                for e in st.closing(resp):
                    yield e
            case Failed():
                yield ev


@router.post("/v1/responses")
async def create_response(req: ResponsesRequest, ctx: CtxDep) -> Response:
    prev = None
    if req.previous_response_id is not None:
        prev = await stored.load(ctx, req.previous_response_id)
        if prev is None:
            return _not_found(req.previous_response_id)
        if req.model is not None and req.model != prev.model:
            return api_error(
                400,
                f"previous_response_id belongs to model {prev.model!r}, not {req.model!r}",
                "model_mismatch",
                "model",
            )
    opened = await open_job(
        ctx,
        prev.model if prev else req.model,
        lambda m: req.to_job(m.engine.tokenizer, template(m), ctx.settings.max_new_tokens),
        "max_output_tokens",
        prev.start if prev else None,
    )
    if isinstance(opened, Response):
        return opened
    m, job, ch = opened
    resp = ResponseObject(
        model=m.name,
        previous_response_id=req.previous_response_id,
        store=req.store,
        instructions=req.instructions,
        temperature=req.temperature,
        top_p=req.top_p,
        max_output_tokens=req.max_output_tokens,
        metadata=req.metadata or {},
    )
    events = _turn(ctx, ch, resp, job.store)
    if not job.stream:
        try:
            async for ev in events:
                if isinstance(ev, Failed):
                    return api_error(500, ev.message, "generation_failed")
        finally:
            await events.aclose()
            ch.close()
        return JSONResponse(resp.model_dump(mode="json"))

    async def stream() -> AsyncIterator[dict | ServerSentEvent]:
        async for ev in events:
            if isinstance(ev, Failed):
                yield {"type": "error", "code": "generation_failed", "message": ev.message}
                return
            yield ServerSentEvent(data=ev.model_dump_json(), event=ev.type)

    return sse(ch, stream())


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, ctx: CtxDep) -> Response:
    got = await stored.load(ctx, response_id)
    if got is None:
        return _not_found(response_id)
    return JSONResponse(got.response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, ctx: CtxDep) -> Response:
    if not await stored.delete(ctx, response_id):
        return _not_found(response_id)
    return JSONResponse(ResponseDeleted(id=response_id).model_dump(mode="json"))


# ---------------------------------------------------------------- pinned prefixes
class PrefixRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = Field(None, description="text after bos (as /v1/completions)")
    messages: list[ChatMessageIn] | None = Field(
        None, description="chat messages, rendered without the assistant prefix"
    )

    @model_validator(mode="after")
    def _one(self) -> PrefixRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


@router.post("/v1/prefixes", status_code=201)
async def pin(req: PrefixRequest, ctx: CtxDep) -> Response:
    m = pick(ctx, req.model)
    if isinstance(m, Response):
        return m
    cache = m.scheduler.prefix_cache
    if cache is None:
        return api_error(409, "the prefix cache is off (prefix_cache_mb=0)", "cache_disabled")
    tok = m.engine.tokenizer
    if req.prompt is not None:
        text, tokens = req.prompt, [tok.bos, *tok.encode(req.prompt)]
    else:
        try:
            msgs = [x.to_message() for x in req.messages or []]
        except UnsupportedField as e:
            return e.response()
        r = template(m).render(msgs, tok, add_generation_prompt=False)
        text, tokens = r.text, r.tokens
    if len(text) > ctx.settings.max_prompt_chars:
        return api_error(422, "prompt: too long", "validation_error", "prompt")
    try:
        res = await m.scheduler.run_sync(pin_prefix, m.engine, cache, tokens)
    except PoolFullError:
        return pool_full(ctx, m).response()
    except PrefixCacheFull as e:
        return api_error(507, str(e), "prefix_cache_full")
    return JSONResponse(
        {
            "object": "prefix",
            "model": m.name,
            "tokens": len(tokens),
            "cached_tokens": res.cached_tokens[0],
            "pinned": True,
        },
        status_code=201,
    )
