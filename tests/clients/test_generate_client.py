"""Generation client, chat session and model listing against a real server."""

from __future__ import annotations

import asyncio

import pytest

from clients import (
    AsyncChatSession,
    AsyncGenerateClient,
    ChatSession,
    ConnectionFailed,
    GenerateClient,
    ServerError,
)

LABELS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]


def run(coro):
    return asyncio.run(coro)


def test_models_health_ready(live_server):
    with GenerateClient(live_server.url) as c:
        assert c.health() and c.ready()
        models = {m.name: m for m in c.models()}
    assert set(models) == {"tiny-lm", "tiny-speech"}
    assert models["tiny-speech"].labels == LABELS and models["tiny-speech"].sample_rate == 16000
    assert models["tiny-lm"].vocab_size == 258 and models["tiny-lm"].labels is None
    assert all(m.state_bytes_per_session and m.state_bytes_per_session > 0 for m in models.values())


def test_streamed_tokens_equal_the_whole_generation(live_server):
    async def go():
        async with AsyncGenerateClient(live_server.url) as c:
            whole = await c.generate("To be, or not", max_new_tokens=12, temperature=0)
            events = [
                e
                async for e in c.generate_stream("To be, or not", max_new_tokens=12, temperature=0)
            ]
            sampled = [
                await c.generate("To be", max_new_tokens=10, temperature=1.0, seed=s)
                for s in (7, 7, 8)
            ]
            return whole, events, sampled

    whole, events, sampled = run(go())
    assert whole.finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens >= len("To be, or not")
    assert all(not e.is_last for e in events[:-1]) and events[-1].is_last
    assert len([e for e in events if e.text]) >= 2  # tokens came one by one, not in one piece
    assert "".join(e.text for e in events) == whole.text
    assert events[-1].finish_reason == "length" and events[-1].usage == whole.usage
    assert sampled[0].text == sampled[1].text  # same seed, same text
    assert sampled[0].text != sampled[2].text


def test_stop_string_and_validation_errors(live_server):
    with GenerateClient(live_server.url) as c:
        base = c.generate("abc", max_new_tokens=16, temperature=0).text
        stop = next(ch for ch in base[3:] if ch.isprintable() and ch != "\ufffd")
        cut = c.generate("abc", max_new_tokens=16, temperature=0, stop=[stop])
        assert cut.finish_reason == "stop" and stop not in cut.text
        assert base.startswith(cut.text)
        with pytest.raises(ServerError) as e:
            c.generate("abc", temperature=-1)
        assert e.value.status == 422 and "temperature" in e.value.message
        with pytest.raises(ServerError) as e:
            list(c.generate_stream("abc", model="no-such-model"))
        assert e.value.status is not None and 400 <= e.value.status < 500
        assert "no-such-model" in e.value.message


def test_connection_refused_is_retried_then_reported():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        GenerateClient(f"http://127.0.0.1:{port}", max_reconnects=1) as c,
        pytest.raises(ConnectionFailed),
    ):
        c.generate("x")


def test_chat_state_carries_over_turns(live_server):
    async def go():
        async with AsyncGenerateClient(live_server.url) as http:
            first_ref = await http.generate("Hello", max_new_tokens=8, temperature=0)
            fresh_second = await http.generate(" world", max_new_tokens=8, temperature=0)
        async with AsyncChatSession(live_server.url, model="tiny-lm") as chat:
            sid = chat.session_id
            first = await chat.say("Hello", max_new_tokens=8, temperature=0)
            await chat.append(" world")
            pieces = [e async for e in chat.generate(max_new_tokens=8, temperature=0)]
        return first_ref, fresh_second, sid, first, pieces

    first_ref, fresh_second, sid, first, pieces = run(go())
    assert sid
    assert first.text == first_ref.text  # first turn equals a one-shot generation
    second = "".join(p.text for p in pieces)
    assert pieces[-1].is_last and pieces[-1].usage is not None
    assert pieces[-1].usage.completion_tokens == 8
    # the second turn is billed only its new text, and continues the conversation's state
    assert pieces[-1].usage.prompt_tokens <= len(" world") + 2
    assert second != fresh_second.text


def test_sync_chat_and_errors(live_server):
    with ChatSession(live_server.url) as chat:
        a = chat.say("One", max_new_tokens=5, temperature=0)
        b = chat.say("Two", max_new_tokens=5, temperature=0)
        assert a.finish_reason == b.finish_reason == "length"
        with pytest.raises(ServerError) as e:
            chat.say("Three", max_new_tokens=5, temperature=-3)
        assert "temperature" in e.value.message
    with pytest.raises(ServerError) as e:
        ChatSession(live_server.url, model="tiny-speech")  # not a text model
    assert e.value.code == "unknown_model"
