"""State-store micro-benchmark: put/get latency per store, signing cost, parked capacity.

For each store (memory, dir in a temporary directory, redis on a redis-server this script
starts on a free 127.0.0.1 port, or --redis-url) and each blob size (default the shipped
models' state blobs: 264 KB speech, 393 KB text): p50/p99 of single puts and gets, the
per-blob cost of a 32-blob `put_many`, each as a ratio to the memory store (the baseline
measured in the same run). Then HMAC sign + verify per blob, and how many parked sessions fit
in --park-mb MB: in the RAM tier (by its byte bound), and in Redis (measured `used_memory`
per stored blob).

Example: nice -n 10 .venv/bin/python benchmarks/bench_store.py --n 100 --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import machine, md_table  # noqa: E402
from server.store import PutItem, StateStore, open_store  # noqa: E402
from server.store.parking import ParkedCache  # noqa: E402
from server.store.signing import StateSigner  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed (scripts/setup.sh installs it)")
    p = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return p, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit("redis-server did not start")


async def latencies(store: StateStore, size: int, n: int) -> dict[str, float]:
    blob = os.urandom(size)
    keys = [uuid.uuid4().hex for _ in range(n)]
    put, get = [], []
    for k in keys:
        t = time.perf_counter()
        await store.put(k, blob)
        put.append(time.perf_counter() - t)
    for k in keys:
        t = time.perf_counter()
        assert (await store.get(k)) is not None
        get.append(time.perf_counter() - t)
    per_item = []
    for _ in range(5):
        batch = [PutItem(uuid.uuid4().hex, blob) for _ in range(32)]
        t = time.perf_counter()
        await store.put_many(batch)
        per_item.append((time.perf_counter() - t) / len(batch))
        keys += [b.key for b in batch]
    for k in keys:
        await store.delete(k)
    return {
        "put50": pct(put, 0.5),
        "put99": pct(put, 0.99),
        "get50": pct(get, 0.5),
        "get99": pct(get, 0.99),
        "batch": pct(per_item, 0.5),
    }


def sign_cost(size: int, n: int) -> tuple[float, float]:
    signer = StateSigner(b"k" * 32)
    payload = os.urandom(size)
    s, v = [], []
    for _ in range(n):
        t = time.perf_counter()
        blob = signer.sign(payload, "m", "h" * 64, 1)
        s.append(time.perf_counter() - t)
        t = time.perf_counter()
        signer.verify(blob, "h" * 64, 1, max_payload_bytes=size)
        v.append(time.perf_counter() - t)
    return pct(s, 0.5), pct(v, 0.5)


async def redis_bytes_per_blob(url: str, size: int, n: int) -> float:
    store = await open_store(f"{url}?prefix=cap{uuid.uuid4().hex[:6]}")
    r = store.r  # RedisStore's client
    before = (await r.info("memory"))["used_memory"]
    blob = os.urandom(size)
    keys = [uuid.uuid4().hex for _ in range(n)]
    for i in range(0, n, 32):
        await store.put_many([PutItem(k, blob) for k in keys[i : i + 32]])
    after = (await r.info("memory"))["used_memory"]
    for k in keys:
        await store.delete(k)
    await store.close()
    return (after - before) / n


async def parked_capacity(size: int, mb: int) -> int:
    store = await open_store("memory")
    pc = ParkedCache(store, max_bytes=mb << 20)
    blob = os.urandom(size)
    for _ in range((mb << 20) // size + 5):
        await pc.park(uuid.uuid4().hex, blob)
    return pc.stats().entries


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stores", nargs="+", default=["memory", "dir", "redis"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[264_000, 393_000])
    ap.add_argument("--n", type=int, default=100, help="puts and gets per store and size")
    ap.add_argument("--park-mb", type=int, default=256)
    ap.add_argument("--redis-url", default=None, help="use this Redis instead of starting one")
    ap.add_argument("--results", type=Path, default=None, help="append a section to this file")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    proc, url = (None, args.redis_url)
    if "redis" in args.stores and url is None:
        proc, url = start_redis(tmp)
    try:
        rows, base = [], {}
        for size in args.sizes:
            for kind in args.stores:
                target = {"memory": "memory", "dir": f"dir:{tmp / 'dir'}", "redis": url}[kind]
                store = await open_store(target)
                r = await latencies(store, size, args.n)
                await store.close()
                if kind == "memory":
                    base[size] = r
                b = base.get(size)
                ratio = lambda key, r=r, b=b: r[key] / b[key] if b else float("nan")  # noqa: E731
                rows.append(
                    [kind, f"{size // 1000} KB", r["put50"] * 1e3, r["put99"] * 1e3,
                     r["get50"] * 1e3, r["get99"] * 1e3, r["batch"] * 1e3,
                     ratio("put50"), ratio("get50")]
                )  # fmt: skip
        lat = md_table(
            ["store", "blob", "put p50 ms", "put p99 ms", "get p50 ms", "get p99 ms",
             "put_many(32) ms/blob (median of 5)", "put p50 / memory", "get p50 / memory"],
            rows,
        )  # fmt: skip
        sign_rows, cap_rows = [], []
        for size in args.sizes:
            s50, v50 = sign_cost(size, args.n)
            sign_rows.append([f"{size // 1000} KB", s50 * 1e3, v50 * 1e3])
            ram = await parked_capacity(size, args.park_mb)
            row = [f"{size // 1000} KB", args.park_mb, ram]
            if url is not None:
                per = await redis_bytes_per_blob(url, size, min(200, args.n * 2))
                row += [per / 1000, int((args.park_mb << 20) / per)]
            cap_rows.append(row)
        sign = md_table(["blob", "sign p50 ms", "verify p50 ms"], sign_rows)
        cap_head = ["blob", "MB", "parked in RAM tier"]
        if url is not None:
            cap_head += ["Redis KB per session", "sessions in MB (Redis)"]
        cap = md_table(cap_head, cap_rows)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    cmd = "python " + " ".join(sys.argv)
    text = (
        f"## State store (benchmarks/bench_store.py), {time.strftime('%Y-%m-%d')}\n\n"
        f"Machine: {machine()}. Command: `{cmd}`\n\n{lat}\n\n{sign}\n\n{cap}\n"
    )
    print(text)
    if args.results is not None:
        with open(args.results, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    asyncio.run(main())
