"""Stored responses in the durable state store (`dir:` and a real `redis-server`): signed
envelopes bound to the response id, kept across a server restart (a follow-up on the new
server continues exactly where the old one would have), refused when tampered with or signed
with another secret; with the in-process memory store they are bounded by
`response_store_mb`."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import openai
import pytest

from server.store import StoreLimits, open_store
from tests.conftest import LM_NAME
from tests.server.conftest import make_settings
from tests.server.live import LiveServer
from tests.server.store.conftest import REDIS_BIN, redis_proc  # noqa: F401 (fixture)

SECRET = "s3cret-for-the-response-tests-0123456789"
GREEDY = {"temperature": 0, "max_output_tokens": 8}


def oai(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.http + "/v1", api_key="unused", max_retries=0, timeout=60)


def stored_blob(url: str, response_id: str) -> bytes:
    async def get() -> bytes:
        store = await open_store(url, StoreLimits())
        try:
            entry = await store.get(response_id.removeprefix("resp_"))
            assert entry is not None, response_id
            return entry.data
        finally:
            await store.close()

    return asyncio.run(get())


def put_blob(url: str, response_id: str, data: bytes) -> None:
    async def put() -> None:
        store = await open_store(url, StoreLimits())
        try:
            await store.put(response_id.removeprefix("resp_"), data, ttl_s=600)
        finally:
            await store.close()

    asyncio.run(put())


def refused(srv: LiveServer) -> float:
    for line in httpx.get(srv.http + "/metrics", timeout=10).text.splitlines():
        if line.startswith('dlr_state_store_failures_total{op="refused"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(params=["dir", "redis"])
def store_url(request, tmp_path) -> str:
    if request.param == "dir":
        return f"dir:{tmp_path / 'state'}"
    if REDIS_BIN is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it)")
    return request.getfixturevalue("redis_proc").url


@pytest.mark.slow
def test_stored_responses_are_signed_and_survive_a_restart(models_dir, store_url):
    settings = make_settings(models_dir, state_store=store_url, state_secret=SECRET)
    with LiveServer(settings) as a:
        c = oai(a)
        r1 = c.responses.create(model=LM_NAME, input="Hello there", **GREEDY)
        # what a follow-up gives on the server that made r1 (not stored)
        want = c.responses.create(
            input="And then?", previous_response_id=r1.id, store=False, **GREEDY
        )
    blob = stored_blob(store_url, r1.id)
    assert blob.startswith(b"DLRSIG")  # the HMAC envelope, not a raw DLRSTATE snapshot
    assert b"DLRSTATE" in blob and r1.id.encode() in blob  # wraps the snapshot, bound to the id
    with LiveServer(settings) as b:  # a new process's app: nothing of r1 in memory
        c = oai(b)
        assert c.responses.retrieve(r1.id).output_text == r1.output_text
        got = c.responses.create(input="And then?", previous_response_id=r1.id, **GREEDY)
        assert got.output_text == want.output_text
        assert got.usage.input_tokens == want.usage.input_tokens  # only the new input was fed
        # tampered with in the store: refused (404), counted, nothing restored
        before = refused(b)
        bad = bytearray(blob)
        bad[len(bad) // 2] ^= 0x01
        put_blob(store_url, r1.id, bytes(bad))
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r1.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.create(input="x", previous_response_id=r1.id, **GREEDY)
        assert refused(b) >= before + 2
        # another response's valid envelope stored under r1's id: bound to its own id
        put_blob(store_url, r1.id, stored_blob(store_url, got.id))
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r1.id)
        assert c.responses.retrieve(got.id).output_text == got.output_text
    other = make_settings(models_dir, state_store=store_url, state_secret=SECRET[::-1])
    with LiveServer(other) as o, pytest.raises(openai.NotFoundError):
        oai(o).responses.retrieve(got.id)  # signed with another secret: not ours


def test_memory_store_responses_are_bounded(models_dir):
    """With the in-process memory state store, stored responses have their own store bounded
    by `response_store_mb` (a tiny-lm response envelope is ~3 KB: 0.02 MiB holds a few)."""
    with LiveServer(make_settings(models_dir, response_store_mb=0.02)) as srv:
        c = oai(srv)
        ids = [
            c.responses.create(model=LM_NAME, input=f"turn {i}", max_output_tokens=1).id
            for i in range(12)
        ]
        found = []
        for rid in ids:
            with contextlib.suppress(openai.NotFoundError):
                found.append(c.responses.retrieve(rid).id)
        assert 0 < len(found) < len(ids)  # the oldest were evicted to fit
        assert ids[-1] in found  # the newest is there
