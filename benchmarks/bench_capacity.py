"""Capacity of one server with a durable store: parked chat sessions held, restore latency.

One real `dlr-serve` subprocess on 127.0.0.1 per store (`redis://` on a redis-server started
here, and `dir:` in a temporary directory), serving one text model written here from a preset
(`--preset`, default `tiny-lm`: random weights, nothing downloaded) with `--slots` live slots.

1. fill: `--sessions` chat sessions over the text WebSocket (`/v1/generate/stream`), at most
   `--concurrency` at a time; each sends `start`, one `append` and a greedy `generate` of
   `--tokens` tokens, then drops its connection (close code 4000, so the session stays for
   resume). Once the slots are taken, every new session parks the longest-idle one (its
   sealed snapshot goes to the parked RAM tier and the store, its slot is freed).
2. held: sessions held (parked + live, from /metrics and /readyz), stored entries and bytes
   (the server's gauges; Redis `used_memory` or the directory's size on disk), server RSS.
3. restore: `--restores` random parked sessions, one at a time, are resumed (`resume` with
   their token) and sent a greedy `generate`: the resume round trip, the time from that
   message to its first token (read from the store + verify + engine restore into a slot
   freed by parking another session + one decode step) and the server's own
   `dlr_park_seconds{op="unpark"}` histogram, p50/p99. Each restored session's tokens are
   compared with a fresh session fed the same conversation (greedy: must be identical).

Example (the RESULTS.md run; it prints a table):
    nice -n 10 .venv/bin/python benchmarks/bench_capacity.py --sessions 100000 --stores redis
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
import torch
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_durable import gauge, hist_quantile, pct  # noqa: E402
from benchmarks.harness import machine, md_table  # noqa: E402
from dlr_runtime import DLRConfig, DLRModel, save_checkpoint  # noqa: E402
from server.settings import Settings  # noqa: E402
from tests.server.live import LiveServer  # noqa: E402
from tests.server.store.conftest import RedisProc  # noqa: E402

TOKENIZER = {"type": "bytes", "bos": 256, "eos": 257, "vocab_size": 258}
PATH = "/v1/generate/stream"
TIMEOUT = 60.0  # every wait on the server


@dataclass
class Chat:
    i: int
    sid: str
    token: str
    seq: int  # last seq seen
    text: str  # the generated text of its first turn


def write_model(root: Path, preset: str) -> Path:
    torch.manual_seed(0)
    cfg = DLRConfig.preset(preset, vocab_size=258)
    save_checkpoint(DLRModel(cfg, seed=1), root / "capacity-lm", tokenizer=TOKENIZER)
    return root


def prompt(i: int) -> str:
    return f"User {i}: hello, remember the number {i * 7919 % 100003}.\n"


async def recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def turn(ws, tokens: int) -> tuple[str, int, float]:
    """A greedy generate: (its text, the last seq, seconds to the first token)."""
    t0 = time.perf_counter()
    await ws.send(json.dumps({"type": "generate", "max_new_tokens": tokens, "temperature": 0}))
    out, first = [], float("nan")
    while True:
        msg = await recv(ws)
        if msg.get("type") == "token":
            if first != first:
                first = time.perf_counter() - t0
            out.append(msg.get("text") or "")
        elif msg.get("type") == "done":
            return "".join(out), int(msg["seq"]), first
        elif msg.get("type") == "error":
            raise RuntimeError(f"server error: {msg}")


async def open_chat(url: str, i: int, tokens: int) -> Chat:
    for attempt in range(20):
        try:
            async with websockets.connect(url + PATH, open_timeout=TIMEOUT) as ws:
                await ws.send(json.dumps({"type": "start"}))
                ready = await recv(ws)
                if ready.get("type") != "ready":
                    raise RuntimeError(f"no ready: {ready}")
                await ws.send(json.dumps({"type": "append", "text": prompt(i)}))
                text, seq, _ = await turn(ws, tokens)
                await ws.close(code=4000, reason="bench: keep for resume")
                return Chat(i, ready["session_id"], ready["resume_token"], seq, text)
        except (OSError, websockets.ConnectionClosed, TimeoutError):
            if attempt == 19:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


async def fill(url: str, n: int, concurrency: int, tokens: int) -> tuple[list[Chat], float]:
    chats: list[Chat] = []
    todo = iter(range(n))
    t0 = time.perf_counter()

    async def worker() -> None:
        for i in todo:
            chats.append(await open_chat(url, i, tokens))
            if len(chats) % 10000 == 0:
                dt = time.perf_counter() - t0
                print(f"  {len(chats)} sessions in {dt:.0f} s", flush=True)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return chats, time.perf_counter() - t0


async def restore(url: str, chat: Chat, tokens: int) -> tuple[float, float, bool]:
    """Resume a parked session and run a turn: (resume s, first token s, output identical)."""
    async with websockets.connect(url + PATH, open_timeout=TIMEOUT) as ws:
        t0 = time.perf_counter()
        await ws.send(
            json.dumps(
                {
                    "type": "resume",
                    "session_id": chat.sid,
                    "resume_token": chat.token,
                    "last_seq": chat.seq,
                }
            )
        )
        ready = await recv(ws)
        t_resume = time.perf_counter() - t0
        if not ready.get("resumed"):
            raise RuntimeError(f"resume of {chat.sid} refused: {ready}")
        got, seq, first = await turn(ws, tokens)
        await ws.close(code=4000)
    chat.seq = seq
    async with websockets.connect(url + PATH, open_timeout=TIMEOUT) as ws:  # the reference
        await ws.send(json.dumps({"type": "start"}))
        await recv(ws)
        await ws.send(json.dumps({"type": "append", "text": prompt(chat.i)}))
        ref1, _, _ = await turn(ws, tokens)
        ref2, _, _ = await turn(ws, tokens)
    return t_resume, first, ref1 == chat.text and ref2 == got


def store_size(kind: str, redis_url: str, path: Path) -> int:
    if kind == "redis":
        return int(redis.Redis.from_url(redis_url).info("memory")["used_memory"])
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


async def measure(srv: LiveServer, kind: str, args, redis_url: str, path: Path) -> list:
    url = srv.ws
    print(f"[{kind}] filling {args.sessions} sessions", flush=True)
    chats, fill_s = await fill(url, args.sessions, args.concurrency, args.tokens)
    async with httpx.AsyncClient(timeout=TIMEOUT) as h:
        await asyncio.sleep(2.0)  # the writer's last batches
        text = (await h.get(srv.http + "/metrics")).text
        live = (await h.get(srv.http + "/readyz")).json()["sessions"]
    parked = gauge(text, "dlr_parked_sessions")
    entries, nbytes = gauge(text, "dlr_state_store_sessions"), gauge(text, "dlr_state_store_bytes")
    rss = srv.rss_bytes()
    size = store_size(kind, redis_url, path)
    rng = random.Random(1)
    parked_chats = chats[: max(1, len(chats) - args.slots)]  # the oldest: parked long ago
    picks = rng.sample(parked_chats, min(args.restores, len(parked_chats)))
    res, firsts, same = [], [], 0
    print(f"[{kind}] restoring {len(picks)} random parked sessions", flush=True)
    for c in picks:
        r, f, ok = await restore(url, c, args.tokens)
        res.append(r)
        firsts.append(f)
        same += ok
    async with httpx.AsyncClient(timeout=TIMEOUT) as h:
        text = (await h.get(srv.http + "/metrics")).text
    u50 = hist_quantile(text, "dlr_park_seconds", "unpark", 0.5)
    u99 = hist_quantile(text, "dlr_park_seconds", "unpark", 0.99)
    return [
        kind,
        len(chats),
        f"{len(chats) / fill_s:.0f}",
        int(parked),
        int(live),
        int(entries),
        f"{nbytes / 2**20:.0f}",
        f"{nbytes / max(entries, 1):.0f}",
        f"{size / 2**20:.0f}",
        f"{rss / 2**20:.0f}",
        f"{pct(res, 0.5) * 1e3:.1f} / {pct(res, 0.99) * 1e3:.1f}",
        f"{pct(firsts, 0.5) * 1e3:.1f} / {pct(firsts, 0.99) * 1e3:.1f}",
        f"{u50 * 1e3:.1f} / {u99 * 1e3:.1f}",
        f"{same}/{len(picks)}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--restores", type=int, default=300)
    ap.add_argument("--preset", default="tiny-lm")
    ap.add_argument("--stores", default="redis,dir")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_capacity_"))
    (tmp / "redis").mkdir()
    models = write_model(tmp / "models", args.preset)
    rows, header = [], f"Machine: {machine()}"
    rp = RedisProc(tmp / "redis").start()
    try:
        for kind in args.stores.split(","):
            path = tmp / "state"
            url = rp.url if kind == "redis" else f"dir:{path}"
            s = Settings(
                device="cpu",
                models_dir=models,
                state_store=url,
                state_secret="bench-secret-0123456789abcdef",
                max_sessions=args.slots,
                resume_grace_s=86400,
                max_detached_per_client=0,  # one client address holds every session here
                park_after_idle_s=0,  # parked only when a new session needs a slot
                log_level="warning",
            )
            srv = LiveServer(s, process=True, log_path=tmp / f"{kind}.log").start()
            try:
                rows.append(asyncio.run(measure(srv, kind, args, rp.url, path)))
            finally:
                srv.kill()
            if kind == "redis":
                redis.Redis.from_url(rp.url).flushdb()
    finally:
        rp.stop()
    cfg = DLRConfig.preset(args.preset, vocab_size=258)
    state_kb = cfg.n_layers * cfg.d_model * cfg.d_state * 8 / 1024
    text = "\n".join(
        [
            header,
            "",
            f"{args.sessions} chat sessions (model preset {args.preset}: {state_kb:.0f} KiB of "
            f"recurrent state), {args.slots} live slots, {args.concurrency} clients at a time, "
            f"{args.tokens} greedy tokens per turn; {args.restores} random parked sessions "
            "restored one at a time:",
            "",
            md_table(
                [
                    "store",
                    "sessions",
                    "made/s",
                    "parked",
                    "live",
                    "stored",
                    "store MiB",
                    "bytes each",
                    "backend MiB",
                    "server RSS MiB",
                    "resume p50/p99 ms",
                    "first token p50/p99 ms",
                    "unpark p50/p99 ms",
                    "identical",
                ],
                rows,
            ),
        ]
    )
    print(text)


if __name__ == "__main__":
    main()
