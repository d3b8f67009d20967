"""The OpenAI-compatible endpoints against a live server, driven by the official `openai`
client: chat completions, completions, responses (streaming and not), compared with the native
`/v1/generate` (same seeds, greedy) and with a plain reference decode of the model; the prefix
cache (same text with it on and off, cached tokens reported, metrics); `n > 1` (one prefill,
forked); session forks over HTTP and the WebSocket; pinned prefixes."""

from __future__ import annotations

import json
import math
import time

import httpx
import openai
import pytest
import torch
from websockets.sync.client import connect

from dlr_runtime import load_recurrent
from dlr_runtime.engine.logit_processors import LogitParams, logprobs_ref, process_ref
from server.chat_template import DEFAULT_TEMPLATE
from tests.conftest import LM_NAME
from tests.server.conftest import make_settings
from tests.server.live import LiveServer

ROLES = DEFAULT_TEMPLATE["roles"]
STOPS = DEFAULT_TEMPLATE["stop"]
MSGS = [
    {"role": "system", "content": "You are a tiny model."},
    {"role": "user", "content": "Say something"},
]


def render(msgs: list[dict]) -> str:
    body = "".join(ROLES[m["role"]] + m["content"] + "\n" for m in msgs)
    return body + ROLES["assistant"]


@pytest.fixture(scope="module")
def servers(models_dir):
    """Two live servers: prefix cache on (default) and off; prompts prefill in pieces of at
    most 256 tokens (one block), so long prompts are fed in several batches."""
    with (
        LiveServer(make_settings(models_dir, max_prefill_tokens=256)) as on,
        LiveServer(make_settings(models_dir, prefix_cache_mb=0, max_prefill_tokens=256)) as off,
    ):
        yield on, off


def oai(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.http + "/v1", api_key="unused", max_retries=0, timeout=60)


def generate(srv: LiveServer, prompt: str, n: int, stop=(), **kw) -> dict:
    body = {"prompt": prompt, "max_new_tokens": n, "stop": list(stop), **kw}
    r = httpx.post(srv.http + "/v1/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def reply_ids(srv: LiveServer, prompt: str, n: int) -> list[int]:
    """The token ids a greedy /v1/generate samples for `prompt` (from its SSE events)."""
    body = {"prompt": prompt, "max_new_tokens": n, "temperature": 0, "stream": True}
    ids = []
    with httpx.stream("POST", srv.http + "/v1/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                ev = json.loads(line[6:])
                if ev["type"] == "token":
                    ids.append(ev["token"]["id"])
    return ids


@pytest.fixture(scope="module")
def ref(models_dir):
    """The plain model: logits after every position of a token list (float64 log-softmax)."""
    model = load_recurrent(models_dir / LM_NAME, dtype=torch.complex128)

    def logits(tokens: list[int]) -> torch.Tensor:
        st = model.init_state(1)
        y, _ = model.chunk(torch.tensor([tokens]), st)  # (1, T, V)
        return y[0].double()  # (T, V)

    return logits


# ---------------------------------------------------------------- chat completions
def test_chat_equals_generate_greedy_seeded_and_streamed(servers):
    on, _ = servers
    c = oai(on)
    prompt = render(MSGS)
    for kw in ({"temperature": 0}, {"temperature": 1.0, "seed": 11}):
        want = generate(on, prompt, 12, STOPS, **kw)
        got = c.chat.completions.create(model=LM_NAME, messages=MSGS, max_tokens=12, **kw)
        assert got.object == "chat.completion" and got.model == LM_NAME
        assert got.choices[0].message.content == want["text"]
        assert got.choices[0].finish_reason == want["finish_reason"]
        assert got.usage.prompt_tokens == 1 + len(prompt.encode())
        assert got.usage.completion_tokens == want["usage"]["completion_tokens"]
        chunks = list(
            c.chat.completions.create(
                model=LM_NAME,
                messages=MSGS,
                max_completion_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
                **kw,
            )
        )
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == want["text"]
        assert (
            chunks[-1].choices == []
            and chunks[-1].usage.completion_tokens == (want["usage"]["completion_tokens"])
        )
        # the second identical request is served from the prefix cache
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_chat_n_choices_fork_one_prefill(servers):
    on, off = servers
    c = oai(on)
    got = c.chat.completions.create(
        model=LM_NAME, messages=MSGS, max_tokens=10, n=3, seed=40, temperature=1.0
    )
    assert [ch.index for ch in got.choices] == [0, 1, 2]
    for i, ch in enumerate(got.choices):  # choice i samples with seed + i
        assert ch.message.content == generate(on, render(MSGS), 10, STOPS, seed=40 + i)["text"]
    assert got.usage.completion_tokens == sum(
        generate(on, render(MSGS), 10, STOPS, seed=40 + i)["usage"]["completion_tokens"]
        for i in range(3)
    )
    streamed = ["", "", ""]
    for chunk in c.chat.completions.create(
        model=LM_NAME, messages=MSGS, max_tokens=10, n=3, seed=40, temperature=1.0, stream=True
    ):
        for ch in chunk.choices:
            streamed[ch.index] += ch.delta.content or ""
    assert streamed == [ch.message.content for ch in got.choices]
    # one prefill for the three choices (cache off: every prompt token is run once)
    before = prompt_tokens_run(off)
    r = oai(off).chat.completions.create(model=LM_NAME, messages=MSGS, max_tokens=3, n=3, seed=1)
    assert prompt_tokens_run(off) - before == r.usage.prompt_tokens


def prompt_tokens_run(srv: LiveServer) -> float:
    for line in httpx.get(srv.http + "/metrics").text.splitlines():
        if line.startswith("dlr_prompt_tokens_total{") and LM_NAME in line:
            return float(line.split()[-1])
    return 0.0


def test_prefix_cache_on_off_same_text_and_metrics(servers):
    on, off = servers
    son, soff = oai(on), oai(off)
    system = {"role": "system", "content": "Shared system prompt " * 30}  # > 2 pieces
    convs = [
        [system, {"role": "user", "content": f"question {i} " * (1 + 9 * i)}] for i in range(4)
    ]
    for i, msgs in enumerate(convs):
        for kw in ({"temperature": 0}, {"seed": 100 + i}):
            a = son.chat.completions.create(model=LM_NAME, messages=msgs, max_tokens=16, **kw)
            b = soff.chat.completions.create(model=LM_NAME, messages=msgs, max_tokens=16, **kw)
            assert a.choices[0].message.content == b.choices[0].message.content
            assert b.usage.prompt_tokens_details.cached_tokens == 0
            if i or kw.get("seed"):  # the system message (at least) came from the cache
                sys_len = 1 + len(render([system]).encode()) - len(ROLES["assistant"])
                assert a.usage.prompt_tokens_details.cached_tokens >= sys_len
    body = httpx.get(on.http + "/metrics").text
    hits = [ln for ln in body.splitlines() if ln.startswith("dlr_prefix_cache_hit_tokens_total{")]
    assert hits and float(hits[0].split()[-1]) > 0
    assert "dlr_prefix_cache_bytes{" in body and "dlr_prefix_cache_evictions_total{" in body
    assert "dlr_prefix_cache_hit_tokens_total{" not in httpx.get(off.http + "/metrics").text


def test_chat_logprobs_penalties_and_bias_match_a_reference_decode(servers, ref):
    on, _ = servers
    c = oai(on)
    prompt = [256, *render(MSGS).encode()]
    params = LogitParams(presence_penalty=0.5, frequency_penalty=1.5, logit_bias={ord(" "): -5})
    got = c.chat.completions.create(
        model=LM_NAME,
        messages=MSGS,
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        presence_penalty=0.5,
        frequency_penalty=1.5,
        logit_bias={str(ord(" ")): -5},
        stop=None,
    )
    entries = got.choices[0].logprobs.content
    # reference: greedy over processed logits, plain loop, float64
    toks, generated = list(prompt), []
    for entry in entries:
        row = process_ref(ref(toks)[-1].tolist(), params, generated)
        best = max(range(len(row)), key=lambda j: (row[j], -j))
        lp, top = logprobs_ref(row, best, 3)
        assert entry.bytes == [best]
        assert math.isclose(entry.logprob, lp, abs_tol=1e-4)
        assert [t.bytes for t in entry.top_logprobs] == [[j] for j, _ in top]
        for t, (_, v) in zip(entry.top_logprobs, top, strict=True):
            assert math.isclose(t.logprob, v, abs_tol=1e-4)
        toks.append(best)
        generated.append(best)
    assert bytes(generated).decode(errors="replace").startswith(got.choices[0].message.content)


def test_unsupported_and_invalid_fields(servers):
    on, _ = servers
    c = oai(on)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(
            model=LM_NAME, messages=MSGS, tools=[{"type": "function", "function": {"name": "f"}}]
        )
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=LM_NAME, messages=MSGS, top_logprobs=2)
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.UnprocessableEntityError):
        c.chat.completions.create(model=LM_NAME, messages=MSGS, frequency_penalty=3)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=MSGS)
    ok = c.chat.completions.create(
        model=LM_NAME, messages=MSGS, max_tokens=2, extra_body={"some_future_field": 1}
    )
    assert ok.choices[0].finish_reason in ("stop", "length")


# ---------------------------------------------------------------- completions
def test_completions_echo_logprobs_n(servers, ref):
    on, _ = servers
    c = oai(on)
    r = c.completions.create(
        model=LM_NAME, prompt="Hi there", max_tokens=6, temperature=0, echo=True, logprobs=2
    )
    ch = r.choices[0]
    want = generate(on, "Hi there", 6, temperature=0)
    assert ch.text == "Hi there" + want["text"]
    lp = ch.logprobs
    assert lp.tokens[: len("Hi there")] == list("Hi there")
    full = ref([256, *b"Hi there"])
    ls = torch.log_softmax(full, -1)
    for i, b in enumerate(b"Hi there"):
        assert math.isclose(lp.token_logprobs[i], float(ls[i, b]), abs_tol=1e-4)
        assert len(lp.top_logprobs[i]) == 2
    assert lp.text_offset[: len("Hi there")] == list(range(len("Hi there")))
    assert len(lp.tokens) == len("Hi there") + want["usage"]["completion_tokens"]
    n2 = c.completions.create(model=LM_NAME, prompt="ab", max_tokens=5, n=2, seed=9)
    for i, choice in enumerate(n2.choices):
        assert choice.text == generate(on, "ab", 5, seed=9 + i)["text"]
    pieces = ["", ""]
    for chunk in c.completions.create(
        model=LM_NAME, prompt="ab", max_tokens=5, n=2, seed=9, stream=True
    ):
        for choice in chunk.choices:
            pieces[choice.index] += choice.text
    assert pieces == [x.text for x in n2.choices]


# ---------------------------------------------------------------- responses
def test_responses_follow_up_continues_the_stored_state(servers):
    on, _ = servers
    c = oai(on)
    r1 = c.responses.create(model=LM_NAME, input="Hello", max_output_tokens=8, temperature=0)
    assert r1.status == "incomplete" and r1.id.startswith("resp_")
    r2 = c.responses.create(
        model=LM_NAME,
        input="Tell me more",
        previous_response_id=r1.id,
        max_output_tokens=8,
        temperature=0,
    )
    assert r2.previous_response_id == r1.id
    # only the new input was fed: the last reply token + "\n" + "User: Tell me more\n..."
    cont = "\nUser: Tell me more\nAssistant: "
    assert r2.usage.input_tokens == 1 + len(cont.encode())
    # the same as a stateless prompt holding the whole history (reply tokens as generated)
    first = "User: Hello\nAssistant: "
    reply = reply_ids(on, first, 8)
    assert bytes(reply).decode(errors="replace") == r1.output_text
    history = [*first.encode(), *reply, *cont.encode()]
    want = oai(on).completions.create(
        model=LM_NAME, prompt=history, max_tokens=8, temperature=0, stop=list(STOPS)
    )
    assert r2.output_text == want.choices[0].text
    # streamed follow-up: same text, events in order
    kinds, text = [], ""
    for ev in c.responses.create(
        model=LM_NAME,
        input="Tell me more",
        previous_response_id=r1.id,
        max_output_tokens=8,
        temperature=0,
        stream=True,
    ):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
    assert text == r2.output_text
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    # stored objects: GET, DELETE, then gone
    got = c.responses.retrieve(r2.id)
    assert got.output_text == r2.output_text
    c.responses.delete(r2.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r2.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=LM_NAME, input="x", previous_response_id=r2.id)
    r3 = c.responses.create(model=LM_NAME, input="Hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r3.id)


def test_response_ttl(models_dir):
    with LiveServer(make_settings(models_dir, response_ttl_s=0.5)) as srv:
        c = oai(srv)
        r = c.responses.create(model=LM_NAME, input="Hello", max_output_tokens=2)
        assert c.responses.retrieve(r.id).id == r.id
        time.sleep(1.0)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)


# ---------------------------------------------------------------- forks and prefixes
def _ws_turn(ws, text: str | None, n: int = 6) -> str:
    if text is not None:
        ws.send(json.dumps({"type": "append", "text": text}))
    ws.send(json.dumps({"type": "generate", "max_new_tokens": n, "temperature": 0}))
    out = ""
    while True:
        m = json.loads(ws.recv(timeout=30))
        if m["type"] == "token":
            out += m["text"]
        elif m["type"] == "done":
            return out
        else:
            raise AssertionError(m)


def _resume(ws, sid: str, token: str) -> None:
    ws.send(json.dumps({"type": "resume", "session_id": sid, "resume_token": token}))
    m = json.loads(ws.recv(timeout=30))
    assert m["type"] in ("resumed", "ready"), m


def test_session_fork_http_and_websocket(servers):
    on, _ = servers
    with connect(on.ws + "/v1/generate/stream", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "start"}))
        ready = json.loads(ws.recv(timeout=30))
        _ws_turn(ws, "Once upon a time")
        ws.send(json.dumps({"type": "fork"}))
        forked = json.loads(ws.recv(timeout=30))
        assert forked["type"] == "forked" and forked["session_id"] != ready["session_id"]
        r = httpx.post(
            f"{on.http}/v1/sessions/{ready['session_id']}/fork",
            headers={"X-Resume-Token": ready["resume_token"]},
        )
        assert r.status_code == 201, r.text
        http_fork = r.json()
        original = _ws_turn(ws, " and then")
    for f in (forked, http_fork):
        with connect(on.ws + "/v1/generate/stream", open_timeout=10) as ws2:
            _resume(ws2, f["session_id"], f["resume_token"])
            assert _ws_turn(ws2, " and then") == original
    bad = httpx.post(f"{on.http}/v1/sessions/{ready['session_id']}/fork")
    assert bad.status_code == 404


def test_pinned_prefix_is_hit(servers):
    on, off = servers
    system = {"role": "system", "content": "A long pinned instruction. " * 5}
    r = httpx.post(on.http + "/v1/prefixes", json={"model": LM_NAME, "messages": [system]})
    assert r.status_code == 201, r.text
    n = r.json()["tokens"]
    got = oai(on).chat.completions.create(
        model=LM_NAME,
        messages=[system, {"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
    )
    assert got.usage.prompt_tokens_details.cached_tokens >= n
    assert httpx.post(off.http + "/v1/prefixes", json={"prompt": "x"}).status_code == 409
    assert httpx.post(on.http + "/v1/prefixes", json={}).status_code == 422
