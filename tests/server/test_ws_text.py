"""WS /v1/generate/stream: persistent text sessions (TestClient) and their error paths."""

from __future__ import annotations

import pytest

from tests.conftest import LM_NAME
from tests.server.conftest import play_until_error


def collect(ws) -> tuple[str, dict]:
    text = []
    while True:
        m = ws.receive_json()
        if m["type"] == "done":
            return "".join(text), m
        assert m["type"] == "token", m
        text.append(m["text"])


def test_turns_continue_the_state(client):
    greedy = {"type": "generate", "max_new_tokens": 6, "temperature": 0}
    with client.websocket_connect("/v1/generate/stream") as ws:
        ws.send_json({"type": "start"})
        ready = ws.receive_json()
        assert ready["type"] == "ready" and ready["model"] == LM_NAME and ready["session_id"]
        ws.send_json({"type": "append", "text": "Hello"})
        ws.send_json(greedy)
        t1, done1 = collect(ws)
        assert done1["finish_reason"] == "length"
        assert done1["usage"] == {"prompt_tokens": 6, "completion_tokens": 6}  # bos + Hello
        ws.send_json({"type": "append", "text": " and more"})
        ws.send_json(greedy)
        t2, done2 = collect(ws)
        assert done2["usage"]["prompt_tokens"] == 10  # last sampled token + 9 new bytes
    # the same conversation as one prompt over HTTP gives the same second turn
    whole = "Hello" + t1 + " and more"
    if all(ch != "\ufffd" for ch in t1):  # the transcript re-encodes to the same bytes
        r = client.post(
            "/v1/generate", json={"prompt": whole, "max_new_tokens": 6, "temperature": 0}
        ).json()
        assert r["text"] == t2


def test_generate_without_append_continues(client):
    with client.websocket_connect("/v1/generate/stream") as ws:
        ws.send_json({"type": "start"})
        ws.receive_json()
        ws.send_json({"type": "generate", "max_new_tokens": 3, "seed": 1})
        _, done = collect(ws)
        assert done["usage"] == {"prompt_tokens": 1, "completion_tokens": 3}  # bos only
        ws.send_json({"type": "generate", "max_new_tokens": 3, "seed": 1})
        _, done = collect(ws)
        assert done["usage"]["prompt_tokens"] == 1  # the pending last token only
        ws.send_json({"type": "generate", "max_new_tokens": 0})
        done = ws.receive_json()
        assert done["type"] == "done" and done["finish_reason"] == "length"
        assert done["usage"] == {"prompt_tokens": 1, "completion_tokens": 0}


@pytest.mark.parametrize(
    "messages,code,close",
    [
        (["{oops"], "invalid_json", 1003),
        ([{"type": "append", "text": "x"}], "no_session", 1008),
        ([{"type": "start", "model": "tiny-speech"}], "unknown_model", 1008),
        ([{"type": "start"}, {"type": "generate", "temperature": -2}], "invalid_message", 1008),
        (
            [{"type": "start"}, {"type": "generate", "max_new_tokens": 10**6}],
            "invalid_message",
            1008,
        ),
        ([{"type": "start"}, b"\x00"], "invalid_message", 1008),
    ],
)
def test_error_paths(client, messages, code, close):
    with client.websocket_connect("/v1/generate/stream") as ws:
        play_until_error(ws, messages, code, close, lambda m: m == {"type": "start"})
