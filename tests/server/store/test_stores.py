"""One suite for every state store (memory, dir, redis; see conftest.make_store): put/get,
delete/touch, list/count, TTL, quotas with LRU eviction reports, batches, id checks, stats."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from server.store import (
    EvictReason,
    InvalidId,
    PutItem,
    StoreLimits,
    ValueTooLarge,
)

pytestmark = pytest.mark.anyio


def sid() -> str:
    return uuid.uuid4().hex


async def test_put_get_replace_delete(make_store) -> None:
    s = await make_store()
    a, b = sid(), sid()
    blob = os.urandom(1000)
    r = await s.put(a, blob)
    assert r.info.key == a and r.info.nbytes == 1000 and r.evicted == ()
    e = await s.get(a)
    assert e is not None and e.data == blob and e.info.nbytes == 1000
    assert await s.get(b) is None
    await s.put(a, b"x" * 10)  # replaces
    assert (await s.get(a)).data == b"x" * 10
    assert await s.usage() == (1, 10)
    assert await s.delete(a) is True
    assert await s.delete(a) is False
    assert await s.get(a) is None
    assert await s.count() == 0


async def test_list_is_lru_order_and_get_counts_as_use(make_store) -> None:
    s = await make_store()
    keys = [sid() for _ in range(4)]
    for k in keys:
        await s.put(k, k.encode())
        await asyncio.sleep(0.005)  # distinct access times (Redis: ms resolution)
    await s.get(keys[0])  # keys[0] becomes the most recently used
    order = [i.key for i in await s.list()]
    assert order == keys[1:] + keys[:1]
    assert [i.key for i in await s.list(limit=2)] == keys[1:3]
    assert await s.count() == 4
    assert await s.usage() == (4, 4 * 32)


async def test_max_entries_evicts_least_recently_used(make_store) -> None:
    s = await make_store(StoreLimits(max_entries=3))
    keys = [sid() for _ in range(3)]
    for k in keys:
        await s.put(k, b"a" * 100)
        await asyncio.sleep(0.005)
    await s.touch(keys[0])
    await asyncio.sleep(0.005)
    new = sid()
    r = await s.put(new, b"b" * 100)
    assert [(e.key, e.reason) for e in r.evicted] == [(keys[1], EvictReason.MAX_ENTRIES)]
    assert r.evicted[0].nbytes == 100
    assert await s.get(keys[1]) is None
    assert {i.key for i in await s.list()} == {keys[0], keys[2], new}
    assert (await s.stats()).evictions["max_entries"] == 1


async def test_max_bytes_evicts_until_it_fits(make_store) -> None:
    s = await make_store(StoreLimits(max_bytes=1000))
    keys = [sid() for _ in range(4)]
    for k in keys:
        await s.put(k, b"a" * 250)
        await asyncio.sleep(0.005)
    r = await s.put(sid(), b"b" * 600)  # 1000 + 600 -> drop 250 x3 to reach 850
    assert [e.key for e in r.evicted] == keys[:3]
    assert {e.reason for e in r.evicted} == {EvictReason.MAX_BYTES}
    assert await s.usage() == (2, 850)
    with pytest.raises(ValueTooLarge):
        await s.put(sid(), b"c" * 1001)
    assert await s.usage() == (2, 850)  # a refused put changes nothing


async def test_replacing_an_entry_never_evicts_itself(make_store) -> None:
    s = await make_store(StoreLimits(max_entries=1, max_bytes=100))
    k = sid()
    for n in (10, 100, 50):
        r = await s.put(k, b"z" * n)
        assert r.evicted == ()
    assert await s.usage() == (1, 50)


async def test_ttl_expires_and_is_reported_by_the_next_put(make_store) -> None:
    s = await make_store(StoreLimits(ttl_s=30))
    short, default, forever = sid(), sid(), sid()
    await s.put(short, b"s", ttl_s=0.5)
    r = await s.put(default, b"d")
    assert (
        r.info.expires_at is not None
        and r.info.expires_at - r.info.accessed_at == pytest.approx(30)
    )
    await s.put(forever, b"f", ttl_s=1e9)
    assert (await s.get(short)).data == b"s"
    await asyncio.sleep(0.7)
    assert await s.get(short) is None
    assert await s.count() == 2
    assert await s.usage() == (2, 2)
    assert {i.key for i in await s.list()} == {default, forever}
    r = await s.put(sid(), b"n")
    assert [(e.key, e.reason) for e in r.evicted] == [(short, EvictReason.EXPIRED)]
    assert not await s.touch(short)


async def test_touch_restarts_the_lifetime(make_store) -> None:
    s = await make_store()
    k = sid()
    await s.put(k, b"t", ttl_s=0.5)
    for _ in range(3):
        await asyncio.sleep(0.2)
        assert await s.touch(k, ttl_s=0.5)
    assert (await s.get(k)).data == b"t"  # 0.6 s after the put: alive through touches
    assert await s.touch(k, ttl_s=0.15)
    await asyncio.sleep(0.3)
    assert await s.get(k) is None


async def test_put_many_is_one_batch_with_results_in_order(make_store) -> None:
    s = await make_store(StoreLimits(max_entries=5))
    keys = [sid() for _ in range(8)]
    rs = await s.put_many([PutItem(k, k.encode() * 2) for k in keys])
    assert [r.info.key for r in rs] == keys
    assert sum(len(r.evicted) for r in rs) == 3
    assert await s.count() == 5
    for k in keys[3:]:
        assert (await s.get(k)).data == k.encode() * 2


@pytest.mark.parametrize(
    "bad",
    ["", "../" + "0" * 29, "0" * 31, "0" * 33, "A" * 32, "g" * 32, "0" * 30 + "/x", None, 7,
     "0" * 32 + "\n", "\u0660" * 32],
)  # fmt: skip
async def test_ids_must_be_uuid_hex(make_store, bad) -> None:
    s = await make_store()
    for call in (lambda: s.put(bad, b"x"), lambda: s.get(bad), lambda: s.delete(bad)):
        with pytest.raises(InvalidId):
            await call()
    assert await s.count() == 0


async def test_stats_count_calls_and_sizes(make_store) -> None:
    s = await make_store()
    k = sid()
    await s.put(k, b"q" * 64)
    await s.get(k)
    await s.get(sid())
    st = await s.stats()
    assert (st.entries, st.bytes, st.writes, st.reads, st.hits, st.misses) == (1, 64, 1, 2, 1, 1)
    assert st.failures == 0 and st.kind in ("memory", "dir", "redis")
    assert st.write_latency.count == 1 and st.read_latency.p99 >= st.read_latency.p50 > 0


async def test_large_blobs_round_trip(make_store) -> None:
    s = await make_store()
    blobs = {sid(): os.urandom(n) for n in (264_000, 393_000)}
    await s.put_many([PutItem(k, v) for k, v in blobs.items()])
    for k, v in blobs.items():
        assert (await s.get(k)).data == v
