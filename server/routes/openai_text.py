"""OpenAI-compatible text endpoints: `POST /v1/chat/completions` and `POST /v1/completions`,
each non-streaming or as Server-Sent Events ending with `data: [DONE]`.

The request models (server/openai_protocol.py) turn a request into a `TextJob`; its choices run
through server/sessions/choices.py (one prefill through the prefix cache, n - 1 forks); the
objects are those of server/openai_objects.py. `usage.prompt_tokens_details.cached_tokens`
counts the prompt tokens whose state came from the prefix cache.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from dlr_runtime.engine.prompt_logprobs import prefill_all_logits, prompt_token_logprobs

from ..context import CtxDep
from ..errors import api_error
from ..events import Done, Failed, Token
from ..openai_objects import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatMessageOut,
    ChoiceLogprobs,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Usage,
    new_id,
    now,
    token_logprob,
)
from ..openai_protocol import ChatCompletionRequest, CompletionRequest
from ..sessions.choices import collect
from .openai_shared import error_chunk, finish, open_job, sse, template

router = APIRouter()


# ---------------------------------------------------------------- chat completions
@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, ctx: CtxDep) -> Response:
    opened = await open_job(
        ctx,
        req.model,
        lambda m: req.to_job(m.engine.tokenizer, template(m), ctx.settings.max_new_tokens),
        "max_completion_tokens",
    )
    if isinstance(opened, Response):
        return opened
    m, job, ch = opened
    tok = m.engine.tokenizer
    want_lp = job.logits.logprobs

    def lp_of(tokens: list[Token]) -> ChoiceLogprobs | None:
        if not want_lp:
            return None
        return ChoiceLogprobs(
            content=[token_logprob(tok, t.id, t.logprob or 0.0, t.top) for t in tokens]
        )

    if not job.stream:
        res = await collect(ch)
        if isinstance(res, Failed):
            return api_error(500, res.message, "generation_failed")
        choices = [
            ChatChoice(
                index=i,
                message=ChatMessageOut(content=text),
                logprobs=lp_of(toks),
                finish_reason=finish(done.reason),
            )
            for i, (toks, text, done) in enumerate(res)
        ]
        n_out = sum(d.completion_tokens for _, _, d in res)
        out = ChatCompletion(
            model=m.name,
            choices=choices,
            usage=Usage.of(ch.prompt_tokens, n_out, ch.cached_tokens),
        )
        return JSONResponse(out.model_dump(mode="json"))

    cid, created = new_id("chatcmpl"), now()

    def chunk(i: int, delta: ChatDelta, **kw) -> dict:
        choice = ChunkChoice(index=i, delta=delta, **kw)
        c = ChatCompletionChunk(id=cid, created=created, model=m.name, choices=[choice])
        return c.model_dump(mode="json")

    async def stream() -> AsyncIterator[dict | str]:
        for i in range(len(job.sampling)):
            yield chunk(i, ChatDelta(role="assistant", content=""))
        n_out = 0
        async for i, ev in ch.events():
            match ev:
                case Token(text=text) if text or want_lp:
                    yield chunk(i, ChatDelta(content=text), logprobs=lp_of([ev]))
                case Done(reason=reason, tail=tail, completion_tokens=n):
                    n_out += n
                    yield chunk(i, ChatDelta(content=tail or None), finish_reason=finish(reason))
                case Failed(message=message):
                    yield error_chunk(message)
        if job.include_usage:
            usage = Usage.of(ch.prompt_tokens, n_out, ch.cached_tokens)
            c = ChatCompletionChunk(id=cid, created=created, model=m.name, choices=[], usage=usage)
            yield c.model_dump(mode="json")
        yield "[DONE]"

    return sse(ch, stream())


# ---------------------------------------------------------------- completions
def _prompt_logprobs(engine, tokens: list[int], k: int) -> tuple[list[float], list[list]]:
    """Logprobs of a prompt's own tokens (engine thread, scratch slot): for echo."""
    slot = engine.open()
    try:
        lp = prompt_token_logprobs(prefill_all_logits(engine, slot, tokens), tokens, k)
    finally:
        engine.close(slot)
    tops = [
        list(zip(i.tolist(), v.tolist(), strict=True))
        for i, v in zip(lp.top_ids, lp.top_logprobs, strict=True)
    ]
    return lp.chosen.tolist(), tops


@router.post("/v1/completions")
async def completions(req: CompletionRequest, ctx: CtxDep) -> Response:
    opened = await open_job(ctx, req.model, lambda m: req.to_job(m.engine.tokenizer), "max_tokens")
    if isinstance(opened, Response):
        return opened
    m, job, ch = opened
    tok = m.engine.tokenizer
    k = job.logits.top_logprobs
    echo_lp: tuple[list[float], list[list]] | None = None
    if job.echo and job.logits.logprobs:  # (the choices wait: one engine thread)
        echo_lp = await m.scheduler.run_sync(_prompt_logprobs, m.engine, job.tokens, k)
    echo = job.prompt_text if job.echo else ""

    def logprobs_of(tokens: list[Token], with_echo: bool) -> CompletionLogprobs | None:
        if not job.logits.logprobs:
            return None
        out, offset = CompletionLogprobs(), 0
        if with_echo and echo_lp is not None:
            for t, lp, top in zip(job.tokens[1:], *echo_lp, strict=True):
                out.add(tok, t, lp, top, offset)
                offset += len(tok.decode([t]))
        for t in tokens:
            out.add(tok, t.id, t.logprob, t.top, offset)
            offset += len(t.text)
        return out

    if not job.stream:
        res = await collect(ch)
        if isinstance(res, Failed):
            return api_error(500, res.message, "generation_failed")
        choices = [
            CompletionChoice(
                index=i,
                text=echo + text,
                logprobs=logprobs_of(toks, True),
                finish_reason=finish(done.reason),
            )
            for i, (toks, text, done) in enumerate(res)
        ]
        n_out = sum(d.completion_tokens for _, _, d in res)
        out = Completion(
            model=m.name, choices=choices, usage=Usage.of(ch.prompt_tokens, n_out, ch.cached_tokens)
        )
        return JSONResponse(out.model_dump(mode="json"))

    cid, created = new_id("cmpl"), now()

    def body(i: int, text: str, reason: str | None, lp=None, usage: Usage | None = None) -> dict:
        c = Completion(
            id=cid,
            created=created,
            model=m.name,
            choices=[CompletionChoice(index=i, text=text, logprobs=lp, finish_reason=reason)],
            usage=usage,
        )
        return c.model_dump(mode="json", exclude={"usage"} if usage is None else set())

    async def stream() -> AsyncIterator[dict | str]:
        n_choices = len(job.sampling)
        if job.echo:
            for i in range(n_choices):
                yield body(i, echo, None, logprobs_of([], True))
        n_out, ended = 0, 0
        async for i, ev in ch.events():
            match ev:
                case Token(text=text) if text or job.logits.logprobs:
                    yield body(i, text, None, logprobs_of([ev], False))
                case Done(reason=reason, tail=tail, completion_tokens=n):
                    n_out += n
                    ended += 1
                    last = ended == n_choices and not job.include_usage
                    usage = Usage.of(ch.prompt_tokens, n_out, ch.cached_tokens) if last else None
                    yield body(i, tail, finish(reason), usage=usage)
                case Failed(message=message):
                    yield error_chunk(message)
        if job.include_usage:
            c = Completion(
                id=cid,
                created=created,
                model=m.name,
                choices=[],
                usage=Usage.of(ch.prompt_tokens, n_out, ch.cached_tokens),
            )
            yield c.model_dump(mode="json")
        yield "[DONE]"

    return sse(ch, stream())
