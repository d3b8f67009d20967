"""Admission: a full server refuses new work (Overloaded with the server's hints); API keys."""

from __future__ import annotations

import asyncio
import threading

import pytest

from clients import AsyncSpeechClient, ChatSession, GenerateClient, Overloaded, ServerError


def test_full_server_refuses_with_overloaded(server_factory, models_dir, word_wav):
    # the server-wide cap (max_sessions is per model: a text session never takes speech slots)
    server = server_factory(models_dir, max_total_sessions="1", retry_after_s="1")
    with ChatSession(server.url) as held:  # takes the only session
        assert held.session_id

        async def speech() -> None:
            async with AsyncSpeechClient(server.url) as c:
                await c.recognize_file(word_wav)

        with pytest.raises(Overloaded) as e:
            asyncio.run(speech())
        assert e.value.code == "overloaded" and e.value.close_code == 1013

        with GenerateClient(server.url) as gen:
            with pytest.raises(Overloaded) as e:
                gen.generate("x", max_new_tokens=2)
            assert e.value.status == 429 and e.value.retry_after == 1.0
            assert isinstance(e.value, ServerError)

        # with retry_overloaded the request waits out Retry-After and succeeds once a slot frees
        release = threading.Timer(0.5, held.close)
        release.start()
        with GenerateClient(server.url, retry_overloaded=True, max_reconnects=5) as gen:
            res = gen.generate("x", max_new_tokens=2, temperature=0)
        release.join()
        assert res.usage is not None and res.usage.completion_tokens == 2


def test_api_key_is_sent_on_http_and_websockets(server_factory, models_dir, word_wav):
    server = server_factory(models_dir, api_keys="k1,k2")
    with GenerateClient(server.url) as anon, pytest.raises(ServerError) as e:
        anon.models()
    assert e.value.status == 401
    with pytest.raises(ServerError) as e:
        asyncio.run(AsyncSpeechClient(server.url).connect())
    assert e.value.status == 401
    with GenerateClient(server.url, api_key="k2") as gen:
        assert gen.generate("x", max_new_tokens=2).usage.completion_tokens == 2

    async def speech() -> str:
        async with AsyncSpeechClient(server.url, api_key="k1") as c:
            return (await c.recognize_file(word_wav)).label

    assert asyncio.run(speech())
    with ChatSession(server.url, api_key="k1") as chat:
        assert chat.say("a", max_new_tokens=2).usage.completion_tokens == 2
