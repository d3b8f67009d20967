"""RedisStore specifics on a real redis-server: replicas share entries and one LRU order,
Redis' own expiry frees blobs, a dead server is `StoreUnavailable`, URL parsing."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from server.store import StoreLimits, StoreUnavailable, open_store, parse_store_url
from server.store.redis_store import RedisStore

pytestmark = pytest.mark.anyio


def sid() -> str:
    return uuid.uuid4().hex


async def test_two_replicas_share_entries_and_quota(redis_server) -> None:
    url = f"{redis_server.url}?prefix=r{uuid.uuid4().hex[:8]}"
    a = await open_store(url, StoreLimits(max_entries=2))
    b = await open_store(url, StoreLimits(max_entries=2))
    k1, k2, k3 = sid(), sid(), sid()
    await a.put(k1, b"1")
    await b.put(k2, b"2")
    assert (await b.get(k1)).data == b"1"  # k1 is now more recent than k2
    r = await a.put(k3, b"3")
    assert [e.key for e in r.evicted] == [k2]
    assert await b.count() == 2
    await a.close()
    await b.close()


async def test_blob_keys_carry_redis_expiry(redis_server) -> None:
    s = RedisStore.from_url(f"{redis_server.url}?prefix=x{uuid.uuid4().hex[:8]}")
    k = sid()
    await s.put(k, b"e", ttl_s=5)
    pttl = await s.r.pttl(f"{s.prefix}:b:{k}")
    assert 0 < pttl <= 5000
    await s.touch(k)  # no ttl: the store's default (none) -> persists
    assert await s.r.pttl(f"{s.prefix}:b:{k}") == -1
    await s.touch(k, ttl_s=0.1)
    await asyncio.sleep(0.25)
    assert await s.r.exists(f"{s.prefix}:b:{k}") == 0  # Redis freed it without a sweep
    assert await s.usage() == (0, 0)
    await s.close()


async def test_dead_server_is_unavailable(redis_proc) -> None:
    url = redis_proc.url
    redis_proc.kill()
    with pytest.raises(StoreUnavailable):
        await open_store(url)
    s = await open_store(url, check=False)  # a server may start while Redis is down
    with pytest.raises(StoreUnavailable):
        await s.put(sid(), b"x")
    st = await s.stats()
    assert (st.entries, st.bytes) == (-1, -1) and st.failures >= 2
    redis_proc.start()
    await s.put(sid(), b"x")  # reconnects by itself
    assert await s.count() == 1
    await s.close()


def test_store_urls() -> None:
    assert parse_store_url("") == ("memory", "")
    assert parse_store_url("memory") == ("memory", "")
    assert parse_store_url("dir:/var/lib/x") == ("dir", "/var/lib/x")
    assert parse_store_url("dir:relative/x") == ("dir", "relative/x")
    assert parse_store_url("redis://h:1/2") == ("redis", "redis://h:1/2")
    for bad in ("dir:", "postgres://x", "file:/x", "mem"):
        with pytest.raises(ValueError, match="state store"):
            parse_store_url(bad)
    assert RedisStore.from_url("redis://127.0.0.1:1/0?prefix=abc").prefix == "abc"
    with pytest.raises(ValueError, match="prefix"):
        RedisStore.from_url("redis://127.0.0.1:1/0?prefix=a:b")
