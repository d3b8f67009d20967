"""CheckpointWriter: batching, coalescing (latest wins), never raising, retries with backoff,
the degraded flag, backlog draining, eviction notices; a real Redis killed and restarted."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from server.store import StoreLimits, open_store
from server.store.writer import CheckpointWriter, WriterConfig
from tests.server.store.conftest import FlakyStore, eventually

pytestmark = pytest.mark.anyio
FAST = WriterConfig(batch_wait_s=0.002, retry_initial_s=0.01, retry_max_s=0.1, op_timeout_s=10.0)


def sid() -> str:
    return uuid.uuid4().hex


async def test_latest_write_wins_and_batches_are_few(make_store) -> None:
    s = await make_store()
    w = CheckpointWriter(s, FAST)
    w.start()
    keys = [sid() for _ in range(40)]
    for v in range(5):
        for k in keys:
            assert w.submit(k, f"{k}:{v}".encode())
    assert await w.flush(10)
    for k in keys:
        assert (await s.get(k)).data == f"{k}:4".encode()
    st = w.stats()
    assert st.submitted == 200 and st.coalesced > 0 and st.written < 200
    assert st.written + st.coalesced == 200
    assert st.batches <= 10 and st.failures == 0 and not st.degraded and st.backlog == 0
    await w.close()


async def test_delete_after_write_wins(make_store) -> None:
    s = await make_store()
    w = CheckpointWriter(s, FAST)
    w.start()
    k, j = sid(), sid()
    w.submit(k, b"old")
    w.submit(j, b"keep")
    assert await w.flush(10)
    w.submit(k, b"new")
    w.submit_delete(k)
    assert w.peek(k).data is None
    assert await w.flush(10)
    assert await s.get(k) is None and (await s.get(j)).data == b"keep"
    await w.close()


async def test_submit_never_raises(make_store) -> None:
    s = await make_store(StoreLimits(max_bytes=100))
    w = CheckpointWriter(s, FAST)
    w.start()
    assert not w.submit("../../etc/passwd", b"x")
    assert not w.submit(sid(), b"y" * 101)
    assert not w.submit(sid(), "not bytes")  # type: ignore[arg-type]
    assert not w.submit_delete("nope")
    assert w.stats().rejected == 4
    assert await w.flush(5) and w.stats().written == 0
    await w.close()


async def test_evictions_reach_on_evict(make_store) -> None:
    s = await make_store(StoreLimits(max_entries=2))
    seen = []
    w = CheckpointWriter(s, FAST, on_evict=seen.append)
    w.start()
    keys = [sid() for _ in range(3)]
    for k in keys:
        w.submit(k, b"z")
        assert await w.flush(5)  # one at a time: a fixed LRU order
        await asyncio.sleep(0.005)
    assert [(e.key, e.reason.value) for e in seen] == [(keys[0], "max_entries")]
    await w.close()


async def test_outage_degrades_retries_and_drains_latest() -> None:
    flaky = FlakyStore(await open_store("memory"))
    w = CheckpointWriter(flaky, FAST)
    w.start()
    keys = [sid() for _ in range(10)]
    w.submit(keys[0], b"before")
    assert await w.flush(5)
    flaky.down = True
    for v in range(3):
        for k in keys:
            assert w.submit(k, f"v{v}".encode())
    await eventually(lambda: w.degraded)
    assert "injected outage" in w.reason
    await eventually(lambda: w.stats().failures >= 3)  # it keeps retrying
    assert not await w.flush(0.2)
    assert w.backlog == 10  # one pending write per session, the latest
    assert w.peek(keys[3]).data == b"v2"
    flaky.down = False
    assert await w.flush(10)
    assert not w.degraded and w.reason is None
    for k in keys:
        assert (await flaky.get(k)).data == b"v2"
    await w.close()


async def test_slow_store_counts_as_failing() -> None:
    flaky = FlakyStore(await open_store("memory"))
    w = CheckpointWriter(
        flaky, WriterConfig(retry_initial_s=0.01, retry_max_s=0.05, op_timeout_s=0.05)
    )
    w.start()
    flaky.delay_s = 0.2
    w.submit(sid(), b"s")
    await eventually(lambda: w.degraded)
    assert "timed out" in w.reason
    flaky.delay_s = 0.0
    assert await w.flush(5) and not w.degraded
    await w.close()


async def test_backlog_is_bounded() -> None:
    flaky = FlakyStore(await open_store("memory"))
    flaky.down = True
    w = CheckpointWriter(flaky, WriterConfig(max_backlog_bytes=1000, retry_initial_s=0.01))
    w.start()
    keys = [sid() for _ in range(30)]
    for k in keys:
        w.submit(k, b"x" * 100)
    st = w.stats()
    assert st.backlog_bytes <= 1100 and st.dropped >= 19
    assert w.peek(keys[0]) is None and w.peek(keys[-1]).data == b"x" * 100
    assert not await w.close(timeout=0.1)


async def test_redis_killed_mid_load_and_restarted(redis_proc) -> None:
    """A real redis-server is SIGKILLed while checkpoints stream in: submits keep returning
    at once, the writer turns degraded and retries; after a restart on the same port the
    backlog drains with the latest blob of every session."""
    s = await open_store(redis_proc.url)
    w = CheckpointWriter(s, FAST)
    w.start()
    keys = [sid() for _ in range(20)]
    latest: dict[str, bytes] = {}
    stop = asyncio.Event()

    async def load() -> None:
        v = 0
        while not stop.is_set():
            for k in keys:
                latest[k] = f"{k}:{v}".encode() * 1000  # ~35 KB
                assert w.submit(k, latest[k])
            v += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(load())
    await eventually(lambda: w.stats().written >= 100)
    redis_proc.kill()
    await eventually(lambda: w.degraded)
    assert "unavailable" in w.reason
    await asyncio.sleep(0.5)  # the load goes on against a dead store
    stop.set()
    await asyncio.wait_for(task, 5)  # the load never saw an exception
    failures = w.stats().failures
    assert failures >= 1 and w.backlog == 20
    redis_proc.start()  # same port, empty (no persistence)
    assert await w.flush(20)
    assert not w.degraded and w.stats().backlog == 0
    for k in keys:
        assert (await s.get(k)).data == latest[k]
    assert (await s.stats()).failures >= 1
    await w.close()
    await s.close()


async def test_backlog_pressure_never_drops_a_delete() -> None:
    flaky = FlakyStore(await open_store("memory"))
    flaky.down = True
    w = CheckpointWriter(flaky, WriterConfig(max_backlog_bytes=250, retry_initial_s=0.01))
    gone = sid()
    w.submit_delete(gone)
    for _ in range(5):
        w.submit(sid(), b"x" * 100)
    assert w.peek(gone) is not None and w.peek(gone).data is None
    assert w.stats().dropped == 3 and w.stats().backlog_bytes == 200


async def test_redis_stalled_then_responsive(redis_proc) -> None:
    """A real Redis that stops answering for a while (DEBUG SLEEP blocks the server): writes
    time out, the writer is degraded, and it recovers by itself without losing a write."""
    s = await open_store(redis_proc.url)
    w = CheckpointWriter(s, WriterConfig(retry_initial_s=0.02, retry_max_s=0.1, op_timeout_s=0.2))
    w.start()
    admin = aioredis.Redis.from_url(redis_proc.url)
    stall = asyncio.create_task(admin.execute_command("DEBUG", "SLEEP", "1.5"))
    await asyncio.sleep(0.1)
    k = sid()
    assert w.submit(k, b"during the stall")
    await eventually(lambda: w.degraded)
    assert "timed out" in w.reason
    await asyncio.wait_for(stall, 10)
    assert await w.flush(10) and not w.degraded
    assert (await s.get(k)).data == b"during the stall"
    await admin.aclose()
    await w.close()
    await s.close()
