"""`DirStore`: one file per session in a directory (survives a crash of the process).

File `<root>/<session_id>.blob`:

    magic      b"DLRSTOR1"                           8 bytes
    expires_at float64 LE, seconds since the epoch    8 bytes (0: never)
    data       the blob

The file's mtime is the entry's last use (the LRU order), so the index is rebuilt from the
directory at open. Writes are atomic: the data goes to a temporary file in the same directory
(`.<id>.<random>.tmp`), is fsynced, renamed over the target, and the directory is fsynced; a
file is complete or absent, and leftover temporary files are removed at open. Ids are checked
as uuid hex before any path is built (`check_id`), so no id can name a path outside `root`.
File I/O runs in worker threads. One process owns a directory at a time (replicas share Redis).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import struct
import time
from collections.abc import Callable
from pathlib import Path

from .base import Entry, EntryInfo, PutItem, PutResult, StateStore, StoreLimits
from .lru import LruIndex

log = logging.getLogger("dlr.store")
MAGIC = b"DLRSTOR1"
_HEAD = struct.Struct("<8sd")
SUFFIX = ".blob"


class DirStore(StateStore):
    kind = "dir"

    def __init__(
        self,
        root: str | Path,
        limits: StoreLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(limits)
        self.root = Path(root)
        self._clock = clock
        self._ix = LruIndex()
        self._lock = asyncio.Lock()  # one writer at a time: renames land in index order
        self._opened = False

    async def open(self) -> DirStore:
        """Create the directory, remove leftover temporary files, load the index."""
        infos = await asyncio.to_thread(self._scan)
        for info in infos:
            self._ix.restore(info)
        self._opened = True
        return self

    # ---- StateStore
    async def _put_many(self, items: list[PutItem]) -> list[PutResult]:
        return await _shielded(self._put_locked(items))

    async def _put_locked(self, items: list[PutItem]) -> list[PutResult]:
        self._require_open()
        last = {it.key: it for it in items}  # a batch writes each key once, its latest data
        async with self._lock:
            now = self._clock()
            await asyncio.to_thread(self._write_files, list(last.values()), now)
            out = []
            for it in items:
                self._ix.sweep(now)
                info = self._ix.set(it.key, len(it.data), it.ttl_s, now)
                evicted = self._ix.fit(self.limits.max_entries, self.limits.max_bytes, {it.key})
                expired = self._ix.take_expired()
                gone = [e.key for e in expired + evicted]
                if gone:
                    await asyncio.to_thread(self._unlink, gone)
                out.append(PutResult(info, tuple(expired + evicted)))
            return out

    async def _get(self, key: str) -> Entry | None:
        self._require_open()
        now = self._clock()
        if self._ix.get(key, now) is None:
            return None
        data = await asyncio.to_thread(self._read, key, now)
        if data is None or not self._ix.use(key, now):
            return None
        return Entry(self._ix.get(key, now), data)

    async def _delete(self, key: str) -> bool:
        return await _shielded(self._delete_locked(key))

    async def _delete_locked(self, key: str) -> bool:
        self._require_open()
        async with self._lock:
            live = self._ix.get(key, self._clock()) is not None
            self._ix.pop(key)
            await asyncio.to_thread(self._unlink, [key])
            return live

    async def _touch(self, key: str, ttl_s: float | None) -> bool:
        return await _shielded(self._touch_locked(key, ttl_s))

    async def _touch_locked(self, key: str, ttl_s: float | None) -> bool:
        self._require_open()
        async with self._lock:
            now = self._clock()
            if not self._ix.use(key, now, ttl_s, renew=True):
                return False
            exp = self._ix.get(key, now).expires_at
            await asyncio.to_thread(self._set_head, key, exp, now)
            return True

    async def _list(self, limit: int | None) -> list[EntryInfo]:
        self._require_open()
        self._ix.sweep(self._clock())  # expired files go at the next put, which reports them
        items = list(self._ix.items(self._clock()))
        return items if limit is None else items[:limit]

    async def _usage(self) -> tuple[int, int]:
        self._require_open()
        self._ix.sweep(self._clock())
        return len(self._ix), self._ix.bytes

    # ---- file I/O (worker threads)
    def path(self, key: str) -> Path:
        return self.root / f"{key}{SUFFIX}"

    def _write_files(self, items: list[PutItem], now: float) -> None:
        tmps: list[tuple[Path, Path]] = []
        try:
            for it in items:
                tmp = self.root / f".{it.key}.{secrets.token_hex(4)}.tmp"
                tmps.append((tmp, self.path(it.key)))
                exp = 0.0 if it.ttl_s is None else now + it.ttl_s
                with open(tmp, "wb") as f:
                    f.write(_HEAD.pack(MAGIC, exp))
                    f.write(it.data)
                    f.flush()
                    os.fsync(f.fileno())
                os.utime(tmp, (now, now))
            for tmp, dst in tmps:
                os.replace(tmp, dst)
            tmps = []
            self._fsync_dir()
        finally:
            for tmp, _ in tmps:  # a failed batch leaves no temporary file behind
                tmp.unlink(missing_ok=True)

    def _read(self, key: str, now: float) -> bytes | None:
        try:
            with open(self.path(key), "rb") as f:
                raw = f.read()
            os.utime(self.path(key), (now, now))
        except FileNotFoundError:
            return None
        if len(raw) < _HEAD.size or raw[:8] != MAGIC:
            log.error("dir store: %s is not a store file; ignoring it", self.path(key).name)
            return None
        return raw[_HEAD.size :]

    def _set_head(self, key: str, expires_at: float | None, now: float) -> None:
        p = self.path(key)
        with open(p, "r+b") as f:
            f.write(_HEAD.pack(MAGIC, 0.0 if expires_at is None else expires_at))
            f.flush()
            os.fsync(f.fileno())
        os.utime(p, (now, now))

    def _unlink(self, keys: list[str]) -> None:
        for k in keys:
            self.path(k).unlink(missing_ok=True)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _scan(self) -> list[EntryInfo]:
        self.root.mkdir(parents=True, exist_ok=True)
        for tmp in self.root.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        now = self._clock()
        infos = []
        for p in self.root.glob(f"*{SUFFIX}"):
            key = p.name[: -len(SUFFIX)]
            try:
                st = p.stat()
                with open(p, "rb") as f:
                    head = f.read(_HEAD.size)
                magic, exp = _HEAD.unpack(head)
                if (
                    magic != MAGIC
                    or len(key) != 32
                    or not all(c in "0123456789abcdef" for c in key)
                ):
                    raise ValueError("not a store file")
            except (OSError, ValueError, struct.error) as e:
                log.error("dir store: skipping %s: %s", p.name, e)
                continue
            expires = None if exp == 0.0 else exp
            if expires is not None and expires <= now:
                p.unlink(missing_ok=True)
                continue
            infos.append(EntryInfo(key, st.st_size - _HEAD.size, st.st_mtime, expires))
        infos.sort(key=lambda i: i.accessed_at)
        return infos

    def _require_open(self) -> None:
        if not self._opened:
            raise RuntimeError("DirStore.open() was not awaited")


async def _shielded(coro):
    """Run a locked file operation to its end even when the caller is cancelled (a timeout):
    its worker thread cannot be stopped, so the lock is held and the index updated until the
    files are in place, and a retry never races an earlier write of the same session."""
    return await asyncio.shield(asyncio.ensure_future(coro))
