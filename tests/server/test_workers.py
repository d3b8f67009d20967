"""DLR_WORKERS > 1: several `dlr-serve` processes on one port (SO_REUSEPORT) over one Redis store.

The real console script as a subprocess: connections spread over both workers, a text
session resumed over new connections (so on either worker) continues exactly like one
uninterrupted conversation, speech streams work on both, SIGTERM drains and stops every
worker, and a memory store is refused (a resume may reach another worker).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server.conftest import process_server
from tests.server.store.conftest import redis_proc  # noqa: F401  (fixture)
from tests.server.wshelp import (
    TEXT,
    drop,
    recv_json,
    resume,
    s16,
    send_json,
    speech_start,
    text_start,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
GEN = {"max_new_tokens": 12, "temperature": 0.8, "seed": 3}
TURNS = ["Hello", " again", " and", " once", " more", " now"]


def worker_pids(url: str, tries: int = 200) -> set[int]:
    """pids answering /healthz over fresh connections (the kernel picks a worker per connection)."""
    seen: set[int] = set()
    for _ in range(tries):
        seen.add(httpx.get(url + "/healthz", timeout=10).json()["pid"])
        if len(seen) >= 2:
            break
    return seen


async def turn(ws, text: str, sent: int) -> tuple[str, int]:
    """One turn; returns its text once the store has confirmed a checkpoint after it (so the
    next connection, on whichever worker, continues from it). `sent`: messages sent before."""
    await send_json(ws, {"type": "append", "text": text})
    await send_json(ws, {"type": "generate", **GEN})
    out, done, sent, stored = [], False, sent + 2, -1
    while not (done and stored >= sent):  # (the confirmation may come before `done`)
        m = await recv_json(ws)
        if m["type"] == "token":
            out.append(m["text"])
        elif m["type"] == "done":
            done = True
        elif m["type"] == "checkpoint":
            stored = max(stored, m["messages_received"])
        else:
            raise AssertionError(m)
    return "".join(out), sent


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_two_workers_share_the_port_and_sessions(
    models_dir: Path,
    tmp_path: Path,
    redis_proc,  # noqa: F811
) -> None:
    srv = process_server(
        models_dir,
        tmp_path / "server.log",
        workers=2,
        state_store=redis_proc.url,
        resume_grace_s=30.0,
    )
    with srv:
        workers = worker_pids(srv.http)
        assert len(workers) == 2, srv.log()
        assert workers <= set(children(srv.proc.pid))  # both are the supervisor's processes

        async def conversation() -> tuple[list[str], list[str]]:
            ws, _ = await text_start(srv.ws)  # the reference: one connection throughout
            solo, sent = [], 0
            for t in TURNS:
                out, sent = await turn(ws, t, sent)
                solo.append(out)
            await ws.close()
            ws, ready = await text_start(srv.ws)  # the same turns, a new connection each
            out, sent = await turn(ws, TURNS[0], 0)
            moved = [out]
            drop(ws)  # (a closed session ends; a dropped one waits for its resume)
            for t in TURNS[1:]:
                ws, _ = await resume(srv.ws, TEXT, ready)
                out, sent = await turn(ws, t, sent)
                moved.append(out)
                drop(ws)
            return solo, moved

        solo, moved = asyncio.run(conversation())
        assert moved == solo

        async def speech(i: int) -> dict:
            rng = np.random.default_rng(i)
            ws, _ = await speech_start(srv.ws, interim_results=False)
            await ws.send(s16(0.1 * rng.standard_normal(16000)))
            await send_json(ws, {"type": "end"})
            while (m := await recv_json(ws))["type"] == "checkpoint":
                pass  # (unnumbered store confirmations come between the other messages)
            await ws.close()
            return m

        async def speeches() -> list[dict]:
            return await asyncio.gather(*(speech(i) for i in range(6)))

        finals = asyncio.run(speeches())
        assert [f["type"] for f in finals] == ["final"] * 6
        assert all(f["audio_ms"] == pytest.approx(1000) for f in finals)
        assert srv.stop(60) == 0
        deadline = time.monotonic() + 30
        while any(os.path.exists(f"/proc/{p}") for p in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(os.path.exists(f"/proc/{p}") for p in workers), "a worker outlived SIGTERM"


def test_several_workers_need_a_shared_store(models_dir: Path) -> None:
    exe = Path(sys.executable).with_name("dlr-serve")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLR_")}
    out = subprocess.run(
        [str(exe), "--workers", "2", "--models-dir", str(models_dir), "--port", "0"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 2
    assert "shared between processes" in out.stderr


def test_a_stale_detached_copy_gives_way_to_the_newer_stored_one(
    models_dir: Path,
    redis_proc,  # noqa: F811
) -> None:
    """Two processes on one store: B recovers and moves on a session A still holds detached;
    a resume that then reaches A continues from B's newer checkpoint, not A's old copy."""
    from tests.server.conftest import make_settings
    from tests.server.live import LiveServer

    settings = make_settings(
        models_dir, state_store=redis_proc.url, state_secret="s" * 32, resume_grace_s=60.0
    )
    with LiveServer(settings) as a, LiveServer(settings) as b:

        async def main() -> tuple[list[str], list[str], dict]:
            ws, _ = await text_start(a.ws)  # the reference, uninterrupted
            solo, sent = [], 0
            for t in TURNS[:3]:
                out, sent = await turn(ws, t, sent)
                solo.append(out)
            await ws.close()
            ws, ready = await text_start(a.ws)
            moved = [(await turn(ws, TURNS[0], 0))[0]]
            drop(ws)  # A keeps it detached
            ws, _ = await resume(b.ws, TEXT, ready)  # B recovers it from the store
            moved.append((await turn(ws, TURNS[1], 2))[0])
            drop(ws)
            ws, again = await resume(a.ws, TEXT, ready)  # back on A, which has the old copy
            moved.append((await turn(ws, TURNS[2], 4))[0])
            drop(ws)
            return solo, moved, again

        solo, moved, again = asyncio.run(main())
        assert again["messages_received"] == 4  # B's checkpoint, not A's stale 2
        assert moved == solo
