"""OpenAI-compatible protocol: request models -> engine jobs, the unsupported-field policy
(400 naming the field), the chat template, and response objects the `openai` package parses."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import openai.types as oai
import pytest
import torch
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from openai._models import construct_type  # the client's own parse path
from openai.types import chat as oai_chat
from openai.types import responses as oai_resp
from pydantic import TypeAdapter, ValidationError
from sse_starlette import EventSourceResponse

from dlr_runtime.engine import ByteTokenizer
from dlr_runtime.engine.logit_processors import logprobs
from server.chat_template import DEFAULT_TEMPLATE, ChatTemplate, Message
from server.errors import validation_handler
from server.openai_objects import (
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
    ResponseDeleted,
    ResponseObject,
    ResponseStream,
    ResponseUsage,
    Usage,
    token_logprob,
    token_text,
)
from server.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponsesRequest,
    UnsupportedField,
)

TOK = ByteTokenizer()
TPL = ChatTemplate.from_metadata({"chat_template": DEFAULT_TEMPLATE})
BYTE_LM = Path(__file__).resolve().parents[2] / "models" / "byte-lm" / "config.json"
MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "!"}]},
]


# ---------------------------------------------------------------- chat template
def test_template_renders_role_prefixed_with_exact_boundaries():
    r = TPL.render([Message("system", "Be brief."), Message("user", "Hi!")], TOK)
    assert r.text == "System: Be brief.\nUser: Hi!\nAssistant: "
    assert r.tokens == [TOK.bos, *r.text.encode()]
    assert r.boundaries == [
        1 + len("System: Be brief.\n"),
        1 + len("System: Be brief.\nUser: Hi!\n"),
    ]
    assert TPL.render([Message("user", "é")], TOK, add_generation_prompt=False).tokens[-3:] == [
        0xC3,
        0xA9,
        10,
    ]


def test_continuation_equals_full_rerender():
    first = TPL.render([Message("user", "Hi")], TOK)
    reply = "Hello there"
    nxt = TPL.render([Message("user", "And?")], TOK, continuation=True)
    full = TPL.render(
        [Message("user", "Hi"), Message("assistant", reply), Message("user", "And?")], TOK
    )
    assert first.tokens + TOK.encode(reply) + nxt.tokens == full.tokens


def test_shipped_byte_lm_has_the_template():
    meta = json.loads(BYTE_LM.read_text())["metadata"]
    t = ChatTemplate.from_metadata(meta)
    assert t.roles["user"] == "User: " and "\nUser:" in t.stop


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "jinja", "template": "{{x}}"},
        {"type": "role-prefixed", "roles": {"user": "U: "}},
        {"type": "role-prefixed", "roles": {**DEFAULT_TEMPLATE["roles"]}, "stop": [""]},
    ],
)
def test_bad_templates_are_refused(spec):
    with pytest.raises(ValueError, match="chat_template"):
        ChatTemplate.from_metadata({"chat_template": spec})


# ---------------------------------------------------------------- requests -> jobs
def test_chat_request_to_job():
    req = ChatCompletionRequest.model_validate(
        {
            "model": "byte-lm",
            "messages": MSGS,
            "n": 3,
            "seed": 7,
            "stop": "END",
            "max_tokens": 5,
            "max_completion_tokens": 9,
            "logprobs": True,
            "top_logprobs": 4,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.25,
            "logit_bias": {"65": -100},
            "stream": True,
            "stream_options": {"include_usage": True},
            "some_future_field": {"x": 1},  # unknown: accepted
            "user": "u1",
            "tools": [],
            "tool_choice": "none",
            "response_format": {"type": "text"},
        }
    )
    job = req.to_job(TOK, TPL, default_max_tokens=100)
    want = TPL.render([Message("system", "Be brief."), Message("user", "Hi !")], TOK)
    assert job.tokens == want.tokens and job.boundaries == want.boundaries
    assert [s.seed for s in job.sampling] == [7, 8, 9]
    assert all(
        s.max_tokens == 9 and s.stop == ["END", "\nUser:", "\nSystem:"] for s in job.sampling
    )
    assert job.logits.logit_bias == {65: -100.0} and job.logits.top_logprobs == 4
    assert job.logits.presence_penalty == 0.5 and job.logits.frequency_penalty == -0.25
    assert job.stream and job.include_usage


def test_chat_defaults():
    job = ChatCompletionRequest(messages=[{"role": "developer", "content": "x"}]).to_job(
        TOK, TPL, default_max_tokens=33
    )
    assert job.tokens[:9] == [TOK.bos, *b"System: "]
    assert len(job.sampling) == 1 and job.sampling[0].max_tokens == 33
    assert not job.logits.logprobs and not job.include_usage


def test_completion_request_to_job():
    req = CompletionRequest(prompt=["abc"], logprobs=2, echo=True, n=2, frequency_penalty=1.0)
    job = req.to_job(TOK)
    assert job.tokens == [TOK.bos, 97, 98, 99] and job.echo and job.prompt_text == "abc"
    assert job.logits.logprobs and job.logits.top_logprobs == 2 and len(job.sampling) == 2
    ids = CompletionRequest(prompt=[104, 105]).to_job(TOK)
    assert ids.tokens == [TOK.bos, 104, 105] and ids.prompt_text == "hi"
    with pytest.raises(UnsupportedField, match="prompt"):
        CompletionRequest(prompt=[104, 999]).to_job(TOK)
    with pytest.raises(ValidationError, match="one prompt"):
        CompletionRequest(prompt=["a", "b"])


def test_responses_request_to_job():
    first = ResponsesRequest(input="Hi", instructions="Be brief.", store=True).to_job(TOK, TPL, 20)
    assert not first.continuation and first.tokens[0] == TOK.bos and first.store
    assert (
        first.tokens
        == TPL.render([Message("system", "Be brief."), Message("user", "Hi")], TOK).tokens
    )
    nxt = ResponsesRequest(
        input=[{"role": "user", "content": [{"type": "input_text", "text": "And?"}]}],
        previous_response_id="resp_1",
        max_output_tokens=4,
    ).to_job(TOK, TPL, 20)
    assert nxt.continuation and nxt.previous_response_id == "resp_1"
    assert nxt.tokens == TPL.render([Message("user", "And?")], TOK, continuation=True).tokens
    assert nxt.sampling[0].max_tokens == 4 and not nxt.logits.logprobs
    lp = ResponsesRequest(input="x", include=["message.output_text.logprobs"], top_logprobs=2)
    job = lp.to_job(TOK, TPL, 20)
    assert job.logits.logprobs and job.logits.top_logprobs == 2


@pytest.mark.parametrize(
    "model, body, field",
    [
        (
            ChatCompletionRequest,
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            "tools",
        ),
        (ChatCompletionRequest, {"response_format": {"type": "json_object"}}, "response_format"),
        (ChatCompletionRequest, {"tool_choice": "required"}, "tool_choice"),
        (ChatCompletionRequest, {"audio": {"voice": "alloy"}}, "audio"),
        (ChatCompletionRequest, {"modalities": ["text", "audio"]}, "modalities"),
        (ChatCompletionRequest, {"min_p": 0.1}, "min_p"),
        (ChatCompletionRequest, {"repetition_penalty": 1.2}, "repetition_penalty"),
        (ChatCompletionRequest, {"top_logprobs": 3}, "top_logprobs"),
        (ChatCompletionRequest, {"stream_options": {"include_usage": True}}, "stream_options"),
        (ChatCompletionRequest, {"logit_bias": {"300": 1}}, "logit_bias"),
        (ChatCompletionRequest, {"prediction": {"type": "content", "content": "x"}}, "prediction"),
        (CompletionRequest, {"suffix": "tail"}, "suffix"),
        (CompletionRequest, {"best_of": 3}, "best_of"),
        (ResponsesRequest, {"text": {"format": {"type": "json_schema"}}}, "text.format"),
        (ResponsesRequest, {"reasoning": {"effort": "high"}}, "reasoning"),
        (ResponsesRequest, {"include": ["reasoning.encrypted_content"]}, "include"),
        (ResponsesRequest, {"truncation": "auto"}, "truncation"),
        (ResponsesRequest, {"background": True}, "background"),
        (ResponsesRequest, {"instructions": "x", "previous_response_id": "resp_1"}, "instructions"),
    ],
)
def test_unsupported_fields_are_refused_by_name(model, body, field):
    base = {ChatCompletionRequest: {"messages": MSGS}, CompletionRequest: {"prompt": "a"}}
    req = model.model_validate({**base.get(model, {"input": "a"}), **body})
    with pytest.raises(UnsupportedField) as e:
        req.to_job(TOK) if model is CompletionRequest else req.to_job(TOK, TPL, 8)
    assert e.value.field == field and field in str(e.value)
    resp = e.value.response()
    assert resp.status_code == 400
    err = json.loads(resp.body)["error"]
    assert err["param"] == field and err["code"] == "unsupported_field"


@pytest.mark.parametrize(
    "body",
    [
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"logit_bias": {"1": 101}},
        {"n": 0},
        {"n": 99},
        {"top_logprobs": 21, "logprobs": True},
        {"temperature": -1},
        {"messages": []},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"messages": [{"role": "tool", "content": "x"}]},
    ],
)
def test_out_of_range_values_fail_validation(body):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": MSGS, **body})


# ---------------------------------------------------------------- objects the client parses
def _roundtrip(ours, theirs_type):
    wire = json.loads(ours.model_dump_json())
    if isinstance(theirs_type, TypeAdapter):
        return theirs_type.validate_python(wire)
    return theirs_type.model_validate(wire)


def _lp_entries():
    x = torch.randn(3, 258)
    chosen = torch.tensor([65, 10, 0xE2])
    lp = logprobs(x, chosen, 2)
    return chosen, lp


def test_chat_completion_and_chunks_parse_with_openai():
    chosen, lp = _lp_entries()
    entries = [
        token_logprob(
            TOK,
            int(chosen[i]),
            float(lp.chosen[i]),
            list(zip(lp.top_ids[i].tolist(), lp.top_logprobs[i].tolist(), strict=True)),
        )
        for i in range(3)
    ]
    ours = ChatCompletion(
        model="byte-lm",
        choices=[
            ChatChoice(
                index=0,
                message=ChatMessageOut(content="A\n\u2026"),
                logprobs=ChoiceLogprobs(content=entries),
                finish_reason="stop",
            )
        ],
        usage=Usage.of(40, 3, cached=32),
    )
    theirs = _roundtrip(ours, oai_chat.ChatCompletion)
    assert theirs.usage.prompt_tokens_details.cached_tokens == 32
    assert theirs.usage.total_tokens == 43
    c = theirs.choices[0].logprobs.content
    assert [e.token for e in c] == ["A", "\n", "bytes:\\xe2"] and c[2].bytes == [0xE2]
    assert abs(c[0].logprob - float(lp.chosen[0])) < 1e-6 and len(c[0].top_logprobs) == 2

    chunk = ChatCompletionChunk(
        id=ours.id,
        created=ours.created,
        model="byte-lm",
        choices=[ChunkChoice(index=1, delta=ChatDelta(role="assistant", content="A"))],
    )
    t = _roundtrip(chunk, oai_chat.ChatCompletionChunk)
    assert t.object == "chat.completion.chunk" and t.choices[0].delta.content == "A"
    usage_chunk = ChatCompletionChunk(
        id=ours.id, created=ours.created, model="m", choices=[], usage=Usage.of(1, 2)
    )
    assert _roundtrip(usage_chunk, oai_chat.ChatCompletionChunk).usage.completion_tokens == 2


def test_completion_with_echo_logprobs_parses_with_openai():
    chosen, lp = _lp_entries()
    logs = CompletionLogprobs()
    logs.add(TOK, 97, None, None, 0)  # echoed prompt token: no logprob
    for i in range(3):
        top = list(zip(lp.top_ids[i].tolist(), lp.top_logprobs[i].tolist(), strict=True))
        logs.add(TOK, int(chosen[i]), float(lp.chosen[i]), top, 1 + i)
    ours = Completion(
        model="byte-lm",
        choices=[CompletionChoice(index=0, text="aA\n", logprobs=logs, finish_reason="length")],
        usage=Usage.of(2, 3),
    )
    # the first echoed token has no logprob (null, as OpenAI sends it); openai's types say
    # list[float], and the client parses leniently (construct_type), as here
    theirs = construct_type(type_=oai.Completion, value=json.loads(ours.model_dump_json()))
    assert isinstance(theirs, oai.Completion)
    assert theirs.choices[0].logprobs.token_logprobs[0] is None
    assert theirs.usage.total_tokens == 5
    # without echo every entry is a number and strict validation passes too
    strict = ours.model_copy(deep=True)
    lg = strict.choices[0].logprobs
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        getattr(lg, name).pop(0)
    theirs = _roundtrip(strict, oai.Completion)
    assert theirs.choices[0].logprobs.tokens[:2] == ["A", "\n"]
    assert len(theirs.choices[0].logprobs.top_logprobs[1]) <= 2


def test_response_objects_and_stream_events_parse_with_openai():
    r = ResponseObject(model="byte-lm", previous_response_id="resp_0", temperature=0.0)
    stream = ResponseStream(r)
    events = [*stream.opening(), stream.delta("Hel"), stream.delta("lo")]
    r.set_text("Hello", "length")
    r.usage = ResponseUsage.of(10, 2, cached=8)
    events += stream.closing(r)
    adapter = TypeAdapter(oai_resp.ResponseStreamEvent)
    parsed = [_roundtrip(e, adapter) for e in events]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert [e.type for e in parsed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    final = parsed[-1].response
    assert final.output_text == "Hello" and final.usage.input_tokens_details.cached_tokens == 8
    assert final.incomplete_details.reason == "max_output_tokens"
    assert parsed[2].item.id == parsed[-2].item.id == final.output[0].id
    whole = _roundtrip(r, oai_resp.Response)
    assert whole.previous_response_id == "resp_0" and whole.output[0].content[0].text == "Hello"
    assert ResponseDeleted(id=r.id).model_dump()["deleted"] is True


def test_token_text_of_special_and_raw_bytes():
    assert token_text(TOK, 256) == ("<bos>", None) and token_text(TOK, 257) == ("<eos>", None)
    assert token_text(TOK, 0x20) == (" ", [0x20])
    assert token_text(TOK, 0x7F) == ("bytes:\\x7f", [0x7F])


# ---------------------------------------------------------------- the openai client end to end
def _wire_app() -> FastAPI:
    """A stand-in app that answers with this module's objects over HTTP and SSE (fixed text),
    so the real `openai` client's request building, SSE decoding and parsing are exercised."""
    app = FastAPI()
    app.add_exception_handler(RequestValidationError, validation_handler)

    def sse(objs):
        async def gen():
            for o in objs:
                yield {
                    "data": o.model_dump_json(),
                    **({"event": o.type} if hasattr(o, "type") else {}),
                }
            if not any(hasattr(o, "type") for o in objs):
                yield {"data": "[DONE]"}

        return EventSourceResponse(gen())

    @app.post("/v1/chat/completions")
    def chat(req: ChatCompletionRequest):
        try:
            job = req.to_job(TOK, TPL, 8)
        except UnsupportedField as e:
            return e.response()
        usage = Usage.of(len(job.tokens), 2, cached=len(job.tokens) - 1)
        if not job.stream:
            return ChatCompletion(
                model="byte-lm",
                choices=[
                    ChatChoice(index=i, message=ChatMessageOut(content="Hi"), finish_reason="stop")
                    for i in range(len(job.sampling))
                ],
                usage=usage,
            )
        base = dict(id="chatcmpl-1", created=1, model="byte-lm")
        chunks = [
            ChatCompletionChunk(
                **base,
                choices=[ChunkChoice(index=0, delta=ChatDelta(role="assistant", content=""))],
            ),
            ChatCompletionChunk(
                **base, choices=[ChunkChoice(index=0, delta=ChatDelta(content="H"))]
            ),
            ChatCompletionChunk(
                **base,
                choices=[ChunkChoice(index=0, delta=ChatDelta(content="i"), finish_reason="stop")],
            ),
        ]
        if job.include_usage:
            chunks.append(ChatCompletionChunk(**base, choices=[], usage=usage))
        return sse(chunks)

    @app.post("/v1/responses")
    def responses(req: ResponsesRequest):
        try:
            job = req.to_job(TOK, TPL, 8)
        except UnsupportedField as e:
            return e.response()
        r = ResponseObject(model="byte-lm", previous_response_id=job.previous_response_id)
        if not job.stream:
            r.set_text("Hi", "stop")
            r.usage = ResponseUsage.of(len(job.tokens), 2)
            return r
        st = ResponseStream(r)
        events = [*st.opening(), st.delta("H"), st.delta("i")]
        r.set_text("Hi", "stop")
        return sse([*events, *st.closing(r)])

    return app


def test_openai_client_parses_our_objects_streaming_and_not():
    with TestClient(_wire_app()) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http)
        msgs = [{"role": "user", "content": "Hello"}]
        out = client.chat.completions.create(model="byte-lm", messages=msgs, n=2, seed=1)
        assert [c.message.content for c in out.choices] == ["Hi", "Hi"]
        assert out.usage.prompt_tokens_details.cached_tokens == out.usage.prompt_tokens - 1
        stream = client.chat.completions.create(
            model="byte-lm", messages=msgs, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="byte-lm", messages=msgs, response_format={"type": "json_object"}
            )
        assert e.value.status_code == 400 and e.value.body["param"] == "response_format"
        # raw HTTP: unknown fields are accepted; a value out of range is a 422 naming it
        ok = http.post("/v1/chat/completions", json={"messages": MSGS, "whatever": 1})
        assert ok.status_code == 200
        bad = http.post("/v1/chat/completions", json={"messages": MSGS, "tools": [{"type": "x"}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools"
        rng = http.post("/v1/chat/completions", json={"messages": MSGS, "presence_penalty": 9})
        assert rng.status_code == 422 and rng.json()["error"]["param"] == "presence_penalty"

        r = client.responses.create(model="byte-lm", input="Hello")
        assert r.output_text == "Hi" and r.status == "completed"
        r2 = client.responses.create(model="byte-lm", input="More", previous_response_id=r.id)
        assert r2.previous_response_id == r.id
        kinds, text = [], ""
        for ev in client.responses.create(model="byte-lm", input="Hello", stream=True):
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
        assert text == "Hi" and kinds[0] == "response.created" and kinds[-1] == "response.completed"
