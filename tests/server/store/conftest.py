"""State-store fixtures: a real `redis-server` on a free 127.0.0.1 port, and one `make_store`
factory parametrized over the three stores (memory, dir, redis), so every test in
test_stores.py runs against each.

The Redis server runs without persistence (`--save ""`, no AOF) with its working directory in
a temporary directory; it is stopped after the session (or the test, for `redis_proc`).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from server.store import StateStore, StoreLimits, StoreUnavailable, open_store

REDIS_BIN = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(REDIS_BIN is None, reason="redis-server is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisProc:
    """One redis-server subprocess on 127.0.0.1; can be killed and restarted on its port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisProc:
        for _attempt in range(3):  # the free port may be taken in between: pick another
            self.proc = subprocess.Popen(
                [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self.workdir), "--protected-mode", "yes",
                 "--maxmemory-policy", "noeviction", "--loglevel", "warning",
                 "--enable-debug-command", "local"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                        s.sendall(b"PING\r\n")
                        if s.recv(16).startswith(b"+PONG"):
                            return self
                except OSError:
                    time.sleep(0.02)
            self.stop()
            self.port = free_port()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        """SIGKILL (everything it held is lost: it keeps nothing on disk)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProc]:
    if REDIS_BIN is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it)")
    r = RedisProc(tmp_path_factory.mktemp("redis")).start()
    yield r
    r.stop()


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[RedisProc]:
    """A Redis server of this test alone (to kill and restart)."""
    if REDIS_BIN is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it)")
    (tmp_path / "redis").mkdir()
    r = RedisProc(tmp_path / "redis").start()
    yield r
    r.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


MakeStore = Callable[..., Awaitable[StateStore]]


@pytest.fixture(params=["memory", "dir", "redis"])
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeStore]:
    """`await make_store(limits)`: a fresh, empty store of the parametrized kind (Redis: its
    own key prefix on the session's server)."""
    opened: list[StateStore] = []
    if request.param == "redis":
        base = request.getfixturevalue("redis_server").url
    n = 0

    async def make(limits: StoreLimits | None = None) -> StateStore:
        nonlocal n
        n += 1
        if request.param == "memory":
            url = "memory"
        elif request.param == "dir":
            url = f"dir:{tmp_path / f'store{n}'}"
        else:
            url = f"{base}?prefix=t{uuid.uuid4().hex[:12]}"
        s = await open_store(url, limits)
        opened.append(s)
        return s

    yield make
    for s in opened:
        await s.close()


class FlakyStore(StateStore):
    """Fault injection by wrapping: `inner`'s behaviour, except that while `down` every call
    raises StoreUnavailable and `delay_s` delays every call."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner.limits)
        self.kind = inner.kind
        self.inner = inner
        self.down = False
        self.delay_s = 0.0
        self.calls = 0

    async def _gate(self) -> None:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.down:
            raise StoreUnavailable("injected outage")

    async def _put_many(self, items):
        await self._gate()
        return await self.inner._put_many(items)

    async def _get(self, key):
        await self._gate()
        return await self.inner._get(key)

    async def _delete(self, key):
        await self._gate()
        return await self.inner._delete(key)

    async def _touch(self, key, ttl_s):
        await self._gate()
        return await self.inner._touch(key, ttl_s)

    async def _list(self, limit):
        await self._gate()
        return await self.inner._list(limit)

    async def _usage(self):
        await self._gate()
        return await self.inner._usage()


async def eventually(pred: Callable[[], bool], timeout: float = 10.0, step: float = 0.01) -> None:
    """Wait until `pred()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout} s")
        await asyncio.sleep(step)
