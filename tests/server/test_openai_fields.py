"""The field policy of the OpenAI request models, audited against OpenAI's (and vLLM's)
parameter lists for chat completions, completions and responses: unknown fields and fields
without effect are accepted; a field that would change the result but is not implemented is
refused with a 400 naming it (`param`); an invalid value is a 422 naming the field. Nothing
that changes a result is silently ignored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from tests.conftest import LM_NAME
from tests.server.conftest import make_settings

CHAT = ("/v1/chat/completions", {"model": LM_NAME, "messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 1})  # fmt: skip
COMPLETIONS = ("/v1/completions", {"model": LM_NAME, "prompt": "hi", "max_tokens": 1})
RESPONSES = ("/v1/responses", {"model": LM_NAME, "input": "hi", "max_output_tokens": 1})
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]

# (endpoint, extra fields, status, the field named in `param`)
REFUSED = [
    (CHAT, {"tools": TOOLS}, 400, "tools"),
    (CHAT, {"tool_choice": "required"}, 400, "tool_choice"),
    (CHAT, {"functions": [{"name": "f"}]}, 400, "functions"),
    (CHAT, {"response_format": {"type": "json_object"}}, 400, "response_format"),
    (
        CHAT,
        {"response_format": {"type": "json_schema", "json_schema": {}}},
        400,
        "response_format",
    ),  # fmt: skip
    (CHAT, {"audio": {"voice": "alloy", "format": "wav"}}, 400, "audio"),
    (CHAT, {"modalities": ["text", "audio"]}, 400, "modalities"),
    (CHAT, {"prediction": {"type": "content", "content": "x"}}, 400, "prediction"),
    (CHAT, {"reasoning_effort": "high"}, 400, "reasoning_effort"),
    (CHAT, {"verbosity": "low"}, 400, "verbosity"),
    (CHAT, {"web_search_options": {"search_context_size": "low"}}, 400, "web_search_options"),
    (CHAT, {"top_logprobs": 2}, 400, "top_logprobs"),  # without logprobs: true
    (CHAT, {"stream_options": {"include_usage": True}}, 400, "stream_options"),  # no stream
    (CHAT, {"echo": True}, 400, "echo"),  # vLLM's chat echo
    (CHAT, {"best_of": 2}, 400, "best_of"),
    (CHAT, {"min_p": 0.1}, 400, "min_p"),
    (CHAT, {"repetition_penalty": 1.2}, 400, "repetition_penalty"),
    (CHAT, {"stop_token_ids": [10]}, 400, "stop_token_ids"),
    (CHAT, {"add_generation_prompt": False}, 400, "add_generation_prompt"),
    (CHAT, {"chat_template": "{{ messages }}"}, 400, "chat_template"),
    (CHAT, {"guided_json": {"type": "object"}}, 400, "guided_json"),
    (CHAT, {"max_output_tokens": 5}, 400, "max_output_tokens"),
    (CHAT, {"logit_bias": {"300": 1}}, 400, "logit_bias"),  # not a token of this vocabulary
    (CHAT, {"logit_bias": {"32": 101}}, 422, "logit_bias"),
    (CHAT, {"logit_bias": {"-1": 1}}, 422, "logit_bias"),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, 422, "top_logprobs"),
    (CHAT, {"n": 17}, 422, "n"),
    (CHAT, {"n": 0}, 422, "n"),
    (CHAT, {"temperature": 2.5}, 422, "temperature"),
    (CHAT, {"top_p": 0}, 422, "top_p"),
    (CHAT, {"presence_penalty": -2.1}, 422, "presence_penalty"),
    (CHAT, {"stop": ["a", "b", "c", "d", "e"]}, 422, "stop"),
    (CHAT, {"seed": -1}, 422, "seed"),
    (CHAT, {"max_completion_tokens": -1}, 422, "max_completion_tokens"),
    (
        CHAT,
        {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]},
        422,
        "messages.0.role",
    ),  # fmt: skip
    (
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}
                    ],
                }
            ]
        },
        422,
        "messages.0.content.str",
    ),  # fmt: skip
    (
        CHAT,
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "1", "type": "function"}],
                }
            ]
        },
        400,
        "messages.tool_calls",
    ),  # fmt: skip
    (COMPLETIONS, {"suffix": "!"}, 400, "suffix"),
    (COMPLETIONS, {"best_of": 3}, 400, "best_of"),
    (COMPLETIONS, {"top_logprobs": 2}, 400, "top_logprobs"),  # completions spell it logprobs: N
    (COMPLETIONS, {"max_completion_tokens": 4}, 400, "max_completion_tokens"),
    (COMPLETIONS, {"response_format": {"type": "json_object"}}, 400, "response_format"),
    (COMPLETIONS, {"stream_options": {"include_usage": True}}, 400, "stream_options"),
    (COMPLETIONS, {"prompt_logprobs": 1}, 400, "prompt_logprobs"),
    (COMPLETIONS, {"logprobs": 6}, 422, "logprobs"),
    (COMPLETIONS, {"prompt": ["a", "b"]}, 422, "prompt"),  # one prompt per request
    (COMPLETIONS, {"prompt": [1, 999]}, 400, "prompt"),  # token id outside the vocabulary
    (COMPLETIONS, {"logit_bias": {"258": 5}}, 400, "logit_bias"),
    (RESPONSES, {"tools": TOOLS}, 400, "tools"),
    (RESPONSES, {"tool_choice": "required"}, 400, "tool_choice"),
    (
        RESPONSES,
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
        400,
        "text.format",
    ),  # fmt: skip
    (RESPONSES, {"text": {"verbosity": "high"}}, 400, "text.verbosity"),
    (RESPONSES, {"reasoning": {"effort": "high"}}, 400, "reasoning"),
    (RESPONSES, {"background": True}, 400, "background"),
    (RESPONSES, {"truncation": "auto"}, 400, "truncation"),
    (RESPONSES, {"include": ["file_search_call.results"]}, 400, "include"),
    (RESPONSES, {"conversation": "conv_123"}, 400, "conversation"),
    (RESPONSES, {"prompt": {"id": "pmpt_123"}}, 400, "prompt"),
    (RESPONSES, {"n": 2}, 400, "n"),
    (RESPONSES, {"logit_bias": {"32": 5}}, 400, "logit_bias"),
    (RESPONSES, {"presence_penalty": 1}, 400, "presence_penalty"),
    (RESPONSES, {"stop": ["x"]}, 400, "stop"),
    (RESPONSES, {"logprobs": True}, 400, "logprobs"),
    (RESPONSES, {"max_tokens": 5}, 400, "max_tokens"),
    (RESPONSES, {"top_logprobs": 21}, 422, "top_logprobs"),
    (RESPONSES, {"max_output_tokens": -1}, 422, "max_output_tokens"),
    (
        RESPONSES,
        {"input": [{"type": "function_call_output", "call_id": "1", "output": "x"}]},
        422,
        "input.str",
    ),  # fmt: skip
]

# accepted: unknown fields, fields without effect on the result, neutral values
ACCEPTED = [
    (
        CHAT,
        {
            "some_future_field": {"a": 1},
            "user": "u",
            "metadata": {"k": "v"},
            "store": True,
            "service_tier": "auto",
            "parallel_tool_calls": True,
            "tool_choice": "none",
            "response_format": {"type": "text"},
            "modalities": ["text"],
            "verbosity": "medium",
            "prompt_cache_key": "k",
            "safety_identifier": "s",
            "add_generation_prompt": True,
            "suffix": "",
            "logit_bias": {},
            "n": 1,
            "best_of": 1,
        },
    ),  # fmt: skip
    (
        CHAT,
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "be"}]},
                {"role": "user", "content": "hi", "name": "ann"},
            ]
        },
    ),  # fmt: skip
    (
        COMPLETIONS,
        {
            "some_future_field": 1,
            "user": "u",
            "best_of": 1,
            "suffix": None,
            "echo": True,
            "logprobs": 0,
            "prompt": ["one prompt"],
        },
    ),  # fmt: skip
    (
        RESPONSES,
        {
            "some_future_field": 1,
            "metadata": {"k": "v"},
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "truncation": "disabled",
            "include": ["message.output_text.logprobs"],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "prompt_cache_key": "k",
            "n": 1,
            "stream_options": {"include_obfuscation": False},
        },
    ),  # fmt: skip
]


@pytest.fixture(scope="module")
def api(models_dir) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(models_dir))) as c:
        yield c


def _id(case) -> str:
    (path, _), extra, *_ = case
    return f"{path.removeprefix('/v1/').replace('/', '_')}-{'-'.join(extra)}"


@pytest.mark.parametrize("case", REFUSED, ids=[_id(c) for c in REFUSED])
def test_unsupported_or_invalid_field_is_refused_naming_it(api, case):
    (path, base), extra, status, param = case
    r = api.post(path, json={**base, **extra})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert param.split(".")[0] in err["message"], err


@pytest.mark.parametrize("case", ACCEPTED, ids=[_id(c) for c in ACCEPTED])
def test_unknown_and_neutral_fields_are_accepted(api, case):
    (path, base), extra = case
    r = api.post(path, json={**base, **extra})
    assert r.status_code == 200, r.text
