"""Text generation over HTTP: `POST /v1/generate` (own format) and `POST /v1/completions`
(OpenAI-compatible), each non-streaming or as Server-Sent Events.

Each request is a short-lived session: a slot is taken, [bos] + prompt bytes are prefilled,
tokens are sampled until max tokens, end of text or a stop string, and the slot is freed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dlr_runtime.engine import PoolFullError

from ..errors import api_error
from ..protocol import CompletionRequest, GenerateRequest, SamplingFields
from ..registry import ModelEntry
from ..scheduler import BatchError, TextSession
from ..state import NoModelError, ServerState, StateDep

router = APIRouter()


def _check(
    st: ServerState,
    req: SamplingFields,
    prompt: str,
    model: str | None,
    max_tokens: int,
    max_field: str,
) -> ModelEntry | Response:
    if len(prompt) > st.settings.max_prompt_chars:
        return api_error(
            422,
            f"prompt: longer than {st.settings.max_prompt_chars} characters",
            "validation_error",
            "prompt",
        )
    if max_tokens > st.settings.max_new_tokens:
        return api_error(
            422, f"{max_field}: at most {st.settings.max_new_tokens}", "validation_error", max_field
        )
    try:
        m = st.pick_model(model, "lm")
    except NoModelError as e:
        return api_error(404, str(e), "model_not_found", "model")
    if st.draining:
        st.metrics.rejections.labels("draining").inc()
        return api_error(
            503,
            "the server is shutting down; retry on another replica",
            "draining",
            headers={"Retry-After": str(st.settings.retry_after_s)},
        )
    why = st.overloaded()
    if why:
        st.metrics.rejections.labels("queue_full").inc()
        return api_error(
            429,
            f"{why}; retry later",
            "overloaded",
            headers={"Retry-After": str(st.settings.retry_after_s)},
        )
    if st.full() or m.engine.pool.available == 0:
        st.metrics.rejections.labels("sessions_full").inc()
        return api_error(
            429,
            "the server is at its session limit; retry later",
            "overloaded",
            headers={"Retry-After": str(st.settings.retry_after_s)},
        )
    return m


async def _events(
    st: ServerState, m: ModelEntry, prompt: str, req: SamplingFields, max_tokens: int
) -> AsyncIterator[tuple]:
    """Run one generation; yields ("start", seed, prompt_tokens), ("token", id, text), then
    ("done", finish_reason, tail, completion_tokens) or ("error", message)."""
    params = req.to_sampling(max_tokens)
    tok = m.engine.tokenizer
    feed = [tok.bos, *tok.encode(prompt)]
    try:
        slot = await m.scheduler.open_slot()
    except PoolFullError:
        yield ("error", "overloaded")
        return
    sid, t0 = st.session_started(m, "generate")
    session = TextSession(slot=slot, pending=feed)
    g = None
    reason = "error"
    try:
        yield ("start", params.seed, len(feed))
        if max_tokens == 0:
            reason = "length"
            yield ("done", "length", "", 0)
            return
        g = m.scheduler.generate(session, params)
        while True:
            ev = await g.events.get()
            if ev[0] == "token":
                yield ev
            elif ev[0] == "done":
                reason = ev[1]
                yield ("done", ev[1], ev[2], g.n_generated)
                return
            else:
                yield ("error", str(ev[1]))
                return
    finally:
        m.scheduler.release(slot, session, g)
        st.session_ended(sid, m, "generate", t0, reason)


def _usage(prompt_tokens: int, completion_tokens: int, total: bool = False) -> dict:
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if total:
        u["total_tokens"] = prompt_tokens + completion_tokens
    return u


def _overloaded(st) -> Response:
    return api_error(
        429,
        "no free session slot; retry later",
        "overloaded",
        headers={"Retry-After": str(st.settings.retry_after_s)},
    )


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


@router.post("/v1/generate")
async def generate(req: GenerateRequest, st: StateDep) -> Response:
    m = _check(st, req, req.prompt, req.model, req.max_new_tokens, "max_new_tokens")
    if isinstance(m, Response):
        return m
    events = _events(st, m, req.prompt, req, req.max_new_tokens)
    first = await anext(events)
    if first[0] == "error":
        return _overloaded(st)
    _, seed, n_prompt = first
    if not req.stream:
        text = []
        try:
            async for ev in events:
                if ev[0] == "token":
                    text.append(ev[2])
                elif ev[0] == "done":
                    text.append(ev[2])
                    return JSONResponse(
                        {
                            "text": "".join(text),
                            "finish_reason": ev[1],
                            "usage": _usage(n_prompt, ev[3]),
                            "seed": seed,
                            "model": m.name,
                        }
                    )
                else:
                    return api_error(500, ev[1], "generation_failed")
        finally:
            await events.aclose()

    async def stream() -> AsyncIterator[str]:
        full, i = [], 0
        try:
            async for ev in events:
                if ev[0] == "token":
                    full.append(ev[2])
                    yield _sse(
                        {
                            "type": "token",
                            "index": i,
                            "token": {"id": ev[1], "text": ev[2]},
                            "text": ev[2],
                        }
                    )
                    i += 1
                elif ev[0] == "done":
                    full.append(ev[2])
                    yield _sse(
                        {
                            "type": "done",
                            "text": ev[2],
                            "finish_reason": ev[1],
                            "usage": _usage(n_prompt, ev[3]),
                            "seed": seed,
                            "generated_text": "".join(full),
                        }
                    )
                else:
                    yield _sse(
                        {"type": "error", "error": {"message": ev[1], "code": "generation_failed"}}
                    )
        finally:
            await events.aclose()

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


@router.post("/v1/completions")
async def completions(req: CompletionRequest, st: StateDep) -> Response:
    m = _check(st, req, req.prompt, req.model, req.max_tokens, "max_tokens")
    if isinstance(m, Response):
        return m
    events = _events(st, m, req.prompt, req, req.max_tokens)
    first = await anext(events)
    if first[0] == "error":
        return _overloaded(st)
    n_prompt = first[2]
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def body(text: str, finish: str | None, usage: dict | None = None) -> dict:
        out = {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": m.name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            out["usage"] = usage
        return out

    if not req.stream:
        text = [req.prompt] if req.echo else []
        try:
            async for ev in events:
                if ev[0] == "token":
                    text.append(ev[2])
                elif ev[0] == "done":
                    text.append(ev[2])
                    return JSONResponse(body("".join(text), ev[1], _usage(n_prompt, ev[3], True)))
                else:
                    return api_error(500, ev[1], "generation_failed")
        finally:
            await events.aclose()

    async def stream() -> AsyncIterator[str]:
        try:
            if req.echo:
                yield _sse(body(req.prompt, None))
            async for ev in events:
                if ev[0] == "token":
                    if ev[2]:
                        yield _sse(body(ev[2], None))
                elif ev[0] == "done":
                    yield _sse(body(ev[2], ev[1], _usage(n_prompt, ev[3], True)))
                else:
                    yield _sse(error_chunk(ev[1]))
            yield _sse("[DONE]")
        finally:
            await events.aclose()

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def error_chunk(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "code": "generation_failed"}}


__all__ = ["BatchError", "router"]
