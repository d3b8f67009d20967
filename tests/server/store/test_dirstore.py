"""DirStore: atomic files (a writer SIGKILLed mid-write leaves a whole file), leftovers
cleaned, index rebuilt at open (crash recovery), foreign files ignored, cancelled writes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from server.store import DirStore, PutItem, StoreLimits, StoreUnavailable
from server.store import dirstore as ds

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]


def sid() -> str:
    return uuid.uuid4().hex


async def test_reopen_restores_entries_lru_order_and_ttl(tmp_path: Path) -> None:
    s = await DirStore(tmp_path / "st").open()
    keys = [sid() for _ in range(3)]
    for k in keys:
        await s.put(k, k.encode() * 3, ttl_s=100 if k == keys[1] else None)
        time.sleep(0.01)
    await s.put(sid(), b"short", ttl_s=0.05)
    await s.get(keys[0])
    time.sleep(0.1)
    again = await DirStore(tmp_path / "st").open()  # a new process after a crash
    infos = await again.list()
    assert [i.key for i in infos] == [keys[1], keys[2], keys[0]]
    assert infos[0].expires_at == pytest.approx(time.time() + 100, abs=2)
    assert infos[1].expires_at is None
    assert (await again.get(keys[1])).data == keys[1].encode() * 3
    assert len(list((tmp_path / "st").iterdir())) == 3  # the expired file was removed


async def test_leftovers_and_foreign_files(tmp_path: Path) -> None:
    root = tmp_path / "st"
    root.mkdir()
    (root / f".{sid()}.abcd.tmp").write_bytes(b"half")
    (root / "notes.blob").write_bytes(b"DLRSTOR1" + b"\0" * 8)
    (root / f"{sid()}.blob").write_bytes(b"garbage!")
    (root / "README").write_text("kept")
    s = await DirStore(root).open()
    assert await s.count() == 0
    assert not list(root.glob("*.tmp")) and (root / "README").exists()


async def test_failed_write_keeps_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch
) -> None:
    s = await DirStore(tmp_path / "st", StoreLimits()).open()
    k = sid()
    await s.put(k, b"old")

    def boom(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ds.os, "fsync", boom)
    with pytest.raises(StoreUnavailable, match="No space left"):
        await s.put(k, b"new")
    monkeypatch.undo()
    assert (await s.get(k)).data == b"old"
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == [f"{k}.blob"]
    assert (await s.stats()).failures == 1


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from server.store import DirStore
    async def main():
        s = await DirStore(sys.argv[1]).open()
        v = 0
        print("ready", flush=True)
        while True:
            await s.put(sys.argv[2], bytes([v % 256]) * 393_000)
            v += 1
    asyncio.run(main())
    """
)


@pytest.mark.parametrize("delay", [0.05, 0.13, 0.21, 0.37])
async def test_sigkill_mid_write_leaves_a_whole_file(tmp_path: Path, delay: float) -> None:
    root, k = tmp_path / "st", sid()
    p = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), k],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    try:
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(delay)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    s = await DirStore(root).open()
    e = await s.get(k)
    if e is not None:  # killed before the first rename: absent is fine, partial is not
        assert len(e.data) == 393_000 and e.data == e.data[:1] * 393_000
    assert not list(root.glob("*.tmp"))


async def test_a_cancelled_write_finishes_before_the_next_one(tmp_path: Path) -> None:
    """A timed-out put cannot stop its worker thread; the next put of the same session must
    not be overtaken by it (the retry of a checkpoint writes newer data)."""
    s = await DirStore(tmp_path / "st").open()
    keys = [sid() for _ in range(20)]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(s.put_many([PutItem(k, b"old" * 100_000) for k in keys]), 0.001)
    await s.put(keys[-1], b"new")
    assert (await s.get(keys[-1])).data == b"new"
    assert await s.count() == 20  # the cancelled batch still completed, index included
    assert not list((tmp_path / "st").glob("*.tmp"))
