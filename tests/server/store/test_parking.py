"""ParkedCache: bounded RAM tier in front of the store; restore from RAM, backlog or store."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from server.store import StoreLimits, open_store
from server.store.parking import ParkedCache, Tier
from server.store.writer import CheckpointWriter, WriterConfig

pytestmark = pytest.mark.anyio


def sid() -> str:
    return uuid.uuid4().hex


async def test_ram_is_bounded_and_spills_oldest_to_the_store(make_store) -> None:
    s = await make_store()
    pc = ParkedCache(s, max_bytes=3000)  # no writer: spills are written before park returns
    blobs = {sid(): os.urandom(1000) for _ in range(5)}
    spilled = []
    for k, v in blobs.items():
        spilled += (await pc.park(k, v)).spilled
    keys = list(blobs)
    assert spilled == keys[:2]
    st = pc.stats()
    assert (st.entries, st.bytes, st.parked, st.spilled) == (3, 3000, 5, 2)
    assert await s.count() == 2  # only the spilled ones went to the store
    for k in keys:
        r = await pc.restore(k)
        assert r.data == blobs[k]
        assert r.tier is (Tier.STORE if k in spilled else Tier.RAM)
    assert pc.stats().entries == 0  # restored sessions are live again
    assert pc.stats().restored == {"ram": 3, "backlog": 0, "store": 2}
    assert await pc.restore(sid()) is None and pc.stats().misses == 1


async def test_with_a_writer_every_park_is_checkpointed() -> None:
    s = await open_store("memory")
    w = CheckpointWriter(s, WriterConfig(batch_wait_s=0))
    pc = ParkedCache(s, max_bytes=1500, writer=w)
    a, b = sid(), sid()
    await pc.park(a, b"a" * 1000)
    r = await pc.park(b, b"b" * 1000)
    assert r.spilled == (a,)
    assert (await pc.restore(a)).tier is Tier.BACKLOG  # the writer has not run yet
    w.start()
    assert await w.flush(5)
    assert (await s.get(b)).data == b"b" * 1000  # also the one still in RAM
    assert (await pc.restore(b)).tier is Tier.RAM
    await pc.park(a, b"a2")
    pc.discard(a)
    w.submit_delete(a)
    assert await pc.restore(a) is None  # its delete is pending: gone
    assert await w.flush(5) and await s.get(a) is None
    await w.close()


async def test_parked_ttl_and_store_eviction_reports() -> None:
    s = await open_store("memory", StoreLimits(max_entries=1))
    pc = ParkedCache(s, max_bytes=10)
    a, b, c = sid(), sid(), sid()
    await pc.park(a, b"x" * 10, ttl_s=5)
    r = await pc.park(b, b"y" * 10)
    assert r.spilled == (a,) and r.evicted == ()
    r = await pc.park(c, b"z" * 10)
    assert r.spilled == (b,) and [e.key for e in r.evicted] == [a]  # store quota: 1 entry
    await pc.park(a, b"w", ttl_s=0.05)
    await asyncio.sleep(0.1)
    assert await pc.restore(a) is None  # expired in RAM (and gone from the store)
