"""`open_store(url)`: the store a `DLR_STATE_STORE` value names.

memory                       this process's RAM (default)
dir:PATH                     one file per session under PATH (created if missing)
redis://HOST:PORT/DB         a Redis server (rediss:// for TLS; `?prefix=NAME` for the
                             key prefix, default `dlr`)
"""

from __future__ import annotations

from .base import StateStore, StoreLimits
from .dirstore import DirStore
from .memory import MemoryStore


def parse_store_url(url: str) -> tuple[str, str]:
    """(kind, target) of a store URL; ValueError naming the accepted forms otherwise."""
    text = (url or "").strip()
    if text in ("", "memory", "memory:"):
        return "memory", ""
    if text.startswith("dir:"):
        path = text[4:].removeprefix("//")
        if not path:
            raise ValueError("state store 'dir:' needs a path, e.g. dir:/var/lib/dlr/state")
        return "dir", path
    if text.startswith(("redis://", "rediss://")):
        return "redis", text
    raise ValueError(
        f"unknown state store {url!r}: use 'memory', 'dir:PATH' or 'redis://HOST:PORT/DB'"
    )


async def open_store(url: str, limits: StoreLimits | None = None, check: bool = True) -> StateStore:
    """Open the store `url` names. With `check`, a Redis store is pinged once, so a wrong
    address is seen at start-up (`StoreUnavailable`); without, a server can start while Redis
    is down and run degraded until it is back."""
    kind, target = parse_store_url(url)
    if kind == "memory":
        return MemoryStore(limits)
    if kind == "dir":
        return await DirStore(target, limits).open()
    from .redis_store import RedisStore  # the redis client is only needed for this kind

    store = RedisStore.from_url(target, limits)
    if not check:
        return store
    try:
        await store.ping()
    except BaseException:
        await store.close()
        raise
    return store
