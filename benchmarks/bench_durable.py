"""Durable sessions benchmark: what checkpoints, parking and failover cost.

Real `dlr-serve` subprocesses on 127.0.0.1 with the shipped models (models/: 393 KB text
state, 264 KB speech state), one per state store (memory = no checkpoints, the baseline;
dir: in a temporary directory; redis:// on a redis-server started here), measured in turns
(interleaved rounds, so load drift hits every store alike):

1. decode throughput: C concurrent chat sessions, T turns of N tokens each (a checkpoint
   after every turn): completion tokens per wall second, as a ratio to memory;
2. stream capacity: S speech streams sent as fast as possible (a checkpoint every
   `--checkpoint-audio-s`): audio seconds processed per wall second, ratio to memory;
3. parking: P chat sessions on a server with `--slots` slots per model; every turn of a
   parked session parks the longest-idle one and restores its own: restore latency p50/p99
   (the server's dlr_park_seconds{op="unpark"} histogram: read + verify + engine restore,
   interpolated within buckets), sessions held (parked + live) and stored bytes each;
4. failover: two replicas on one Redis behind HAProxy (deploy/haproxy.cfg); F real-time
   speech streams; one replica SIGKILLed mid-stream (twice, alternating): the client-visible
   gap (last result before the drop -> first result after the resume) p50/p99.

Example: nice -n 10 .venv/bin/python benchmarks/bench_durable.py --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import machine, md_table  # noqa: E402
from clients import AsyncChatSession, AsyncSpeechClient  # noqa: E402
from server.settings import Settings  # noqa: E402
from tests.server.live import LiveServer  # noqa: E402
from tests.server.replicas import Replicas  # noqa: E402
from tests.server.store.conftest import RedisProc  # noqa: E402

GEN = {"max_new_tokens": 32, "temperature": 0.8, "seed": 1}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def tone(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    x = 0.3 * np.sin(2 * np.pi * (200 + 30 * seed) * t) + 0.05 * rng.standard_normal(t.size)
    return x.astype(np.float32)


def server(store: str, tmp: Path, name: str, **kw) -> LiveServer:
    s = Settings(
        device="cpu",
        state_store=store,
        state_secret="bench-secret-0123456789abcdef",
        partial_interval_ms=100,
        log_level="warning",
        **kw,
    )
    return LiveServer(s, process=True, log_path=tmp / f"{name}.log").start()


async def decode_rate(url: str, c: int, turns: int) -> float:
    async def one(i: int) -> int:
        async with AsyncChatSession(url) as chat:
            n = 0
            for t in range(turns):
                r = await chat.say(f"Turn {t} of chat {i}:", **GEN)
                n += r.usage.completion_tokens
            return n

    t0 = time.perf_counter()
    n = sum(await asyncio.gather(*(one(i) for i in range(c))))
    return n / (time.perf_counter() - t0)


async def stream_rate(url: str, s: int, seconds: float) -> float:
    async def one(k: int) -> None:
        async with AsyncSpeechClient(url) as cl:
            chunks = np.array_split(tone(seconds, k), int(seconds * 10))
            async for _ in cl.stream(chunks, sample_rate=16000, interim_results=False):
                pass

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(s)))
    return s * seconds / (time.perf_counter() - t0)


def hist_quantile(metrics: str, name: str, op: str, q: float) -> float:
    """Prometheus-style quantile of a histogram (linear within its bucket)."""
    pat = re.compile(rf'{name}_bucket\{{le="([^"]+)",op="{op}"\}} ([0-9.e+]+)')
    buckets = sorted((float(le), float(v)) for le, v in pat.findall(metrics))
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    total, lo_le, lo_n = buckets[-1][1], 0.0, 0.0
    for le, n in buckets:
        if n >= q * total:
            if le == float("inf"):
                return lo_le
            return lo_le + (le - lo_le) * (q * total - lo_n) / max(n - lo_n, 1e-9)
        lo_le, lo_n = le, n
    return lo_le


def gauge(metrics: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", metrics, re.M)
    return float(m.group(1)) if m else float("nan")


async def parking(url: str, p: int) -> tuple[float, float, float, float, float]:
    conns = []
    for i in range(p):
        ch = AsyncChatSession(url)
        await ch.open()
        await ch.say(f"Chat {i}:", **GEN)
        conns.append(ch)
    for i, ch in enumerate(conns):  # each restores its own state, parking another
        await ch.say(f" more {i}", **GEN)
    async with httpx.AsyncClient(timeout=30) as h:
        text = (await h.get(url + "/metrics")).text
        held = (await h.get(url + "/readyz")).json()["sessions"]
    parked = gauge(text, "dlr_parked_sessions")
    stored, nbytes = gauge(text, "dlr_state_store_sessions"), gauge(text, "dlr_state_store_bytes")
    for ch in conns:
        await ch.close()
    p50 = hist_quantile(text, "dlr_park_seconds", "unpark", 0.5)
    p99 = hist_quantile(text, "dlr_park_seconds", "unpark", 0.99)
    return p50, p99, held + parked, stored, nbytes / max(stored, 1)


async def failover(rs: Replicas, f: int, kills: int) -> list[float]:
    gaps: list[float] = []
    seconds = 6.0 + 20.0 * kills  # (a replica restart takes ~15 s on a loaded 2-core machine)

    async def one(k: int, go: asyncio.Event) -> None:
        async with AsyncSpeechClient(rs.lb, resume_timeout=90, max_reconnects=10) as cl:
            chunks = np.array_split(tone(seconds, k), int(seconds * 20))
            last, seen = time.perf_counter(), 0
            async for r in cl.stream(chunks, sample_rate=16000, realtime=True):
                now = time.perf_counter()
                if cl.reconnects > seen:  # first result after a resume
                    gaps.append(now - last)
                    seen = cl.reconnects
                last = now
                if r.audio_ms > 1500:
                    go.set()

    async def operator(go: asyncio.Event) -> None:
        await go.wait()
        for j in range(kills):
            victim = j % 2
            await asyncio.sleep(1.0)
            rs.kill(victim)
            await asyncio.to_thread(rs.restart, victim)
            await asyncio.to_thread(rs.wait_up, victim)

    go = asyncio.Event()
    await asyncio.gather(*(one(k, go) for k in range(f)), operator(go))
    return gaps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chats", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--stream-seconds", type=float, default=10.0)
    ap.add_argument("--checkpoint-audio-s", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parked", type=int, default=64)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--failover-streams", type=int, default=6)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument(
        "--phases", default="cost,parking,failover", help="comma-separated subset to run"
    )
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_durable_"))
    (tmp / "redis").mkdir()
    redis = RedisProc(tmp / "redis").start()
    out: list[str] = [f"Machine: {machine()}", ""]
    try:
        stores = {"memory": "memory", "dir": f"dir:{tmp / 'state'}", "redis": redis.url}
        phases = set(args.phases.split(","))
        kw = dict(checkpoint_audio_s=args.checkpoint_audio_s, park_after_idle_s=0)
        srvs = {k: server(v, tmp, k, **kw) for k, v in stores.items()} if "cost" in phases else {}
        dec: dict[str, list[float]] = {k: [] for k in stores}
        aud: dict[str, list[float]] = {k: [] for k in stores}
        try:
            for _ in range(args.rounds):
                for k, s in srvs.items():
                    dec[k].append(asyncio.run(decode_rate(s.url, args.chats, args.turns)))
                    aud[k].append(
                        asyncio.run(stream_rate(s.url, args.streams, args.stream_seconds))
                    )
        finally:
            for s in srvs.values():
                s.kill()
        if srvs:
            rows = []
            for k in stores:
                d, a = float(np.median(dec[k])), float(np.median(aud[k]))
                d0, a0 = float(np.median(dec["memory"])), float(np.median(aud["memory"]))
                rows.append([k, d, d / d0, a, a / a0])
            out += [
                f"Checkpoint cost ({args.chats} chats x {args.turns} turns of "
                f"{GEN['max_new_tokens']} tokens, a checkpoint per turn; {args.streams} streams x "
                f"{args.stream_seconds:g} s as fast as possible, a checkpoint every "
                f"{args.checkpoint_audio_s:g} s of audio; median of {args.rounds} interleaved rounds):",
                "",
                md_table(
                    ["store", "tokens/s", "ratio", "audio s / s", "ratio"],
                    rows,
                ),
                "",
            ]
        if "parking" in phases:
            rows = []
            for k in ("memory", "dir", "redis"):
                s = server(
                    stores[k], tmp, f"park-{k}", max_sessions=args.slots, park_after_idle_s=0
                )
                try:
                    rows.append([k, *asyncio.run(parking(s.url, args.parked))])
                finally:
                    s.kill()
            out += [
                f"Parking ({args.parked} chat sessions, {args.slots} slots per model; every second "
                "turn restores a parked session and parks another):",
                "",
                md_table(
                    [
                        "store",
                        "unpark p50 s",
                        "unpark p99 s",
                        "sessions held",
                        "stored",
                        "bytes each",
                    ],
                    [[r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5])] for r in rows],
                ),
                "",
            ]
        if "failover" in phases:
            with Replicas(
                ROOT / "models", tmp, redis.url + "?prefix=fo", checkpoint_audio_s=args.checkpoint_audio_s,
                partial_interval_ms=100, log_level="warning",
            ) as rs:  # fmt: skip
                gaps = asyncio.run(failover(rs, args.failover_streams, args.kills))
            out += [
                f"Failover ({args.failover_streams} real-time streams through HAProxy over 2 "
                f"replicas on one Redis; {args.kills} SIGKILLs of a replica, then its restart): "
                f"client-visible gap over {len(gaps)} resumed streams p50 {pct(gaps, 0.5):.2f} s, "
                f"p99 {pct(gaps, 0.99):.2f} s (includes the client's 0.5 s reconnect backoff and "
                "HAProxy's health check marking the replica down).",
            ]
    finally:
        redis.stop()
    text = "\n".join(out)
    print(text)
    if args.results is not None:
        cmd = "nice -n 10 .venv/bin/python benchmarks/bench_durable.py " + " ".join(sys.argv[1:])
        section = (
            f"\n## Durable sessions: checkpoints, parking, failover (benchmarks/bench_durable.py), "
            f"{time.strftime('%Y-%m-%d')}\n\nCommand: `{cmd}`\n\n{text}\n"
        )
        with open(args.results, "a") as f:
            f.write(section)


if __name__ == "__main__":
    main()
