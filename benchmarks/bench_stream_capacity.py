"""How many real-time speech streams one dlr-serve holds: partial lag vs streams, per config.

One real `dlr-serve` subprocess on 127.0.0.1 with the shipped speech model (or `--model`), for
each configuration (`--workers` server processes, chunk size) and each number of streams N.
The load generator runs in `--client-procs` separate processes on the same machine (the
machine's cores are shared with it, as the goal asks). Each stream sends pcm_s16le chunks of
`chunk_ms` at real-time pace (stream starts spread over 1 s) for `--seconds`, in utterance mode
(every frame computed: no voice-activity gate) at the server's default partial interval.

- partial lag, sampled at each partial: wall time since the stream started (one chunk before
  its first chunk is sent: when a microphone would have started filling it) minus the
  partial's `audio_ms` (what a user sees as delay, including time the audio waited in the
  client, the socket and the server); the first second of each stream is skipped (warm-up);
- final latency: time from `end` to the final;
- "real time": lag p99 < `--rt-lag-ms` (300), every final < `--rt-final-ms` (500), no errors;
- memory per stream: (server RSS with N streams open - idle RSS) / N, summed over the
  server's processes (supervisor + workers);
- the engine alone in the same run: `bench_audio_streams`-style batches of `chunk_ms` for B
  streams through `Engine.feed_audio` on one thread: real-time streams per core.

More than one worker needs a shared store: a redis-server is started on a free port.

    nice -n 10 .venv/bin/python -m benchmarks.bench_stream_capacity --streams 32 64 128 \
        --chunk-ms 100 20 --workers 1 2 --results benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness import append_results, machine, md_table  # noqa: E402

RATE = 16000
WARMUP_S = 1.0


# ---------------------------------------------------------------------- load generator
def _audio(seed: int, seconds: float, speech_share: float) -> np.ndarray:
    """A voiced tone with noise (speech_share 1), or 0.6 s voiced bursts covering
    `speech_share` of the time over a quiet room (-80 dBFS)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    voiced = 0.2 * np.sin(2 * np.pi * (150 + 10 * (seed % 20)) * t) + 0.05 * rng.standard_normal(n)
    if speech_share >= 1:
        return voiced
    x = 1e-4 * rng.standard_normal(n)
    burst = int(0.6 * RATE)
    for start in range(int(rng.integers(0, RATE)), n - burst, int(burst / speech_share)):
        x[start : start + burst] = voiced[start : start + burst]
    return x


async def _stream(
    url: str, model: str, chunk_ms: int, seconds: float, delay: float, seed: int, opts: dict
):
    import websockets

    n = RATE * chunk_ms // 1000
    pcm = (np.clip(_audio(seed, seconds, opts["speech_share"]), -1, 1) * 32767).astype("<i2")
    await asyncio.sleep(delay)
    lags: list[float] = []
    out = {"lags": lags, "final_ms": float("nan"), "error": "", "detections": 0}
    try:
        async with websockets.connect(url + "/v1/speech/stream", max_size=None) as ws:
            start = {"type": "start", "sample_rate": RATE, "encoding": "pcm_s16le", "model": model}
            if opts["mode"] == "continuous":
                start["mode"] = "continuous"
            await ws.send(json.dumps(start))
            ready = json.loads(await ws.recv())
            if ready.get("type") != "ready":
                out["error"] = str(ready)[:200]
                return out
            t0 = time.perf_counter()
            done = asyncio.get_running_loop().create_future()

            async def reader() -> None:
                while True:
                    m = json.loads(await ws.recv())
                    if m["type"] == "partial":  # (the microphone started a chunk before t0)
                        since = time.perf_counter() - t0 + chunk_ms / 1000
                        if since > WARMUP_S:
                            lags.append(since * 1000 - m["audio_ms"])
                    elif m["type"] == "detection":
                        out["detections"] += 1
                    elif m["type"] == "final":
                        done.set_result(time.perf_counter())
                        return
                    elif m["type"] == "error":
                        raise RuntimeError(f"{m.get('code')}: {m.get('message')}")

            task = asyncio.create_task(reader())
            for i in range(len(pcm) // n):
                await asyncio.sleep(max(0.0, t0 + i * chunk_ms / 1000 - time.perf_counter()))
                await ws.send(pcm[i * n : (i + 1) * n].tobytes())
                if task.done():
                    break
            t_end = time.perf_counter()
            await ws.send(json.dumps({"type": "end"}))
            await asyncio.wait_for(asyncio.shield(task), seconds + 60)
            out["final_ms"] = (done.result() - t_end) * 1000
    except Exception as e:  # noqa: BLE001  (reported as an error of this stream)
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    return out


def _client_proc(url, model, chunk_ms, seconds, first, count, total, opts, q) -> None:
    async def main():
        return await asyncio.gather(
            *[
                _stream(url, model, chunk_ms, seconds, (first + i) / total, first + i, opts)
                for i in range(count)
            ]
        )

    q.put(asyncio.run(main()))


def run_load(
    url: str, model: str, n: int, chunk_ms: int, seconds: float, procs: int, opts: dict
) -> list:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    ps, first = [], 0
    for count in per:
        if count:
            p = ctx.Process(
                target=_client_proc,
                args=(url, model, chunk_ms, seconds, first, count, n, opts, q),
            )
            p.start()
            ps.append(p)
        first += count
    res = [r for _ in ps for r in q.get()]
    for p in ps:
        p.join()
    return res


# ---------------------------------------------------------------------- server side
def tree_rss(pid: int) -> int:
    """RSS (bytes) of a process and its children (supervisor + workers)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = (task / "children").read_text().split()
                todo += [int(k) for k in kids]
        except (FileNotFoundError, StopIteration, ProcessLookupError):
            continue
    return total * 1024


def engine_ceiling(
    model_dir: Path, chunk_ms: int, batch: int, backend: str, seconds: float = 3.0
) -> float:
    """Real-time streams one engine thread sustains (compute only): batch x audio/compute,
    with the server's malloc settings (`keep_freed_memory`)."""
    import torch

    from dlr_runtime import load_recurrent
    from dlr_runtime.backends import make_backend
    from dlr_runtime.engine import Engine
    from dlr_runtime.engine.malloc import keep_freed_memory

    torch.set_num_threads(1)
    keep_freed_memory()
    rec = load_recurrent(model_dir)
    eng = Engine(make_backend(rec, backend), model_dir.name, batch)
    slots = [eng.open() for _ in range(batch)]
    n = RATE * chunk_ms // 1000
    x = torch.randn(batch, n) * 0.1
    eng.feed_audio(slots, list(x))  # warm-up
    t0, audio = time.perf_counter(), 0.0
    while time.perf_counter() - t0 < seconds:
        eng.feed_audio(slots, list(x))
        audio += chunk_ms / 1000
    return batch * audio / (time.perf_counter() - t0)


def measure(args, workers: int, chunk_ms: int, n: int, redis_url: str, tmp: Path) -> dict:
    from server.settings import Settings
    from tests.server.live import LiveServer

    s = Settings(
        device="cpu",
        models_dir=args.models_dir,
        max_sessions=max(n + 16, 256),
        max_connections_per_client=0,  # (every stream comes from 127.0.0.1)
        workers=workers,
        state_store=redis_url if workers > 1 else "",
        state_secret="bench-secret-0123456789abcdef",
        torch_threads=1,
        log_level="warning",
        **({"backend": args.backend} if args.backend else {}),
        **({"max_batch_size": args.max_batch_size} if args.max_batch_size else {}),
        **({"max_batch_wait_ms": args.max_batch_wait_ms} if args.max_batch_wait_ms >= 0 else {}),
    )
    srv = LiveServer(s, process=True, log_path=tmp / f"w{workers}-c{chunk_ms}-n{n}.log").start()
    try:
        opts = {"mode": args.mode, "speech_share": args.speech_share}
        run_load(srv.ws, args.model, min(n, 4), chunk_ms, 1.5, 1, opts)  # warm-up
        time.sleep(0.5)
        idle = tree_rss(srv.proc.pid)
        res = run_load(srv.ws, args.model, n, chunk_ms, args.seconds, args.client_procs, opts)
        lags = [x for r in res for x in r["lags"]]
        finals = [r["final_ms"] for r in res if r["final_ms"] == r["final_ms"]]
        errors = [r["error"] for r in res if r["error"]]
        peak = tree_rss(srv.proc.pid)
    finally:
        srv.kill()
    p50 = float(np.percentile(lags, 50)) if lags else float("nan")
    p99 = float(np.percentile(lags, 99)) if lags else float("nan")
    fmax = max(finals) if finals else float("nan")
    ok = not errors and p99 < args.rt_lag_ms and len(finals) == n and fmax < args.rt_final_ms
    return {
        "workers": workers,
        "chunk_ms": chunk_ms,
        "streams": n,
        "lag_p50_ms": p50,
        "lag_p99_ms": p99,
        "final_max_ms": fmax,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "real_time": ok,
        "finals": len(finals),
        "kib_per_stream": (peak - idle) / 1024 / n,
        "detections": sum(r["detections"] for r in res),
        "rss_mb": peak / 2**20,
    }


def combine(runs: list[dict], args) -> dict:
    """One point from repeated runs: medians of the latencies and sizes, errors summed; real
    time when the medians meet the bounds and no run had an error (a single run's p99 moves
    by 2x between runs on this shared machine)."""
    med = lambda k: float(np.median([r[k] for r in runs]))  # noqa: E731
    out = {**runs[0], **{k: med(k) for k in ("lag_p50_ms", "lag_p99_ms", "final_max_ms",
                                             "kib_per_stream", "rss_mb")}}  # fmt: skip
    out["errors"] = sum(r["errors"] for r in runs)
    out["first_error"] = next((r["first_error"] for r in runs if r["first_error"]), "")
    out["p99_runs"] = [r["lag_p99_ms"] for r in runs]
    out["real_time"] = (
        out["errors"] == 0
        and out["lag_p99_ms"] < args.rt_lag_ms
        and out["final_max_ms"] < args.rt_final_ms
        and all(r["finals"] == r["streams"] for r in runs)
    )
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key in sorted({(r["workers"], r["chunk_ms"]) for r in rows}):
        rs = sorted(
            (r for r in rows if (r["workers"], r["chunk_ms"]) == key), key=lambda r: r["streams"]
        )
        xs = [r["streams"] for r in rs]
        (line,) = ax.plot(xs, [r["lag_p99_ms"] for r in rs], marker="o",
                          label=f"{key[0]} worker(s), {key[1]} ms chunks: p99")  # fmt: skip
        ax.plot(xs, [r["lag_p50_ms"] for r in rs], ls="--", color=line.get_color(), label="p50")
    ax.axhline(300, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("concurrent real-time streams")
    ax.set_ylabel("partial lag (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("dlr-serve: partial lag vs streams (2-core machine, load generator included)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", type=Path, default=ROOT / "models")
    ap.add_argument("--model", default="speech-commands")
    ap.add_argument("--streams", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--chunk-ms", type=int, nargs="+", default=[100, 20])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=10.0, help="audio per stream")
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--backend", default=None, help="the server's backend (default: its own)")
    ap.add_argument("--max-batch-size", type=int, default=0, help="the server's (0: its default)")
    ap.add_argument(
        "--max-batch-wait-ms", type=float, default=-1, help="the server's (-1: its default)"
    )
    ap.add_argument("--mode", choices=["utterance", "continuous"], default="utterance")
    ap.add_argument("--speech-share", type=float, default=1.0, help="voiced share of the audio")
    ap.add_argument("--rt-lag-ms", type=float, default=300.0)
    ap.add_argument("--rt-final-ms", type=float, default=500.0)
    ap.add_argument("--stop-after-miss", action="store_true", help="skip larger N once one misses")
    ap.add_argument(
        "--repeats", type=int, default=1, help="runs per point (their medians are reported)"
    )
    ap.add_argument("--plot", type=Path, default=ROOT / "benchmarks/plots/stream_capacity.png")
    ap.add_argument("--results", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_stream_capacity_"))
    redis_proc = None
    if max(args.workers) > 1:
        from tests.server.store.conftest import RedisProc

        (tmp / "redis").mkdir()
        redis_proc = RedisProc(tmp / "redis").start()
    rows: list[dict] = []
    try:
        for workers in args.workers:
            for chunk in args.chunk_ms:
                for n in sorted(args.streams):
                    url = redis_proc.url if redis_proc else ""
                    r = combine(
                        [measure(args, workers, chunk, n, url, tmp) for _ in range(args.repeats)],
                        args,
                    )
                    rows.append(r)
                    print(json.dumps(r), flush=True)
                    if args.stop_after_miss and not r["real_time"]:
                        break
    finally:
        if redis_proc is not None:
            redis_proc.stop()
    ceil = {
        (be, c): engine_ceiling(args.models_dir / args.model, c, 64, be)
        for c in args.chunk_ms
        for be in ("torch", "fused")  # the torch chunk form and the server's default
    }
    plot(rows, args.plot)
    table = md_table(
        ["workers", "chunk ms", "streams", "lag p50 ms", "lag p99 ms", "p99 of each run",
         "final max ms", "errors", "real time", "KiB / stream", "server RSS MB"],
        [[r["workers"], r["chunk_ms"], r["streams"], f"{r['lag_p50_ms']:.0f}",
          f"{r['lag_p99_ms']:.0f}", " / ".join(f"{x:.0f}" for x in r["p99_runs"]),
          f"{r['final_max_ms']:.0f}", r["errors"], "yes" if r["real_time"] else "no",
          f"{r['kib_per_stream']:.0f}", f"{r['rss_mb']:.0f}"]
         for r in rows],
    )  # fmt: skip
    best = {}
    for r in rows:
        if r["real_time"]:
            key = (r["workers"], r["chunk_ms"])
            best[key] = max(best.get(key, 0), r["streams"])
    lines = [
        f"{args.repeats} run(s) per point (medians; real time: median lag p99 < "
        f"{args.rt_lag_ms:g} ms, median final max < {args.rt_final_ms:g} ms, no errors). "
        f"Mode {args.mode}, voiced share of the audio {args.speech_share:g}, {args.seconds:g} s per "
        f"stream, model {args.model}, server backend {args.backend or 'default (fused)'}, max batch "
        f"size {args.max_batch_size or 'default (64)'}, max batch wait "
        f"{args.max_batch_wait_ms if args.max_batch_wait_ms >= 0 else 'default (2)'} ms.",
        f"Machine: {machine()}, load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        table,
        "",
        "Most real-time streams per configuration: "
        + ", ".join(f"{w} worker(s) / {c} ms: {n}" for (w, c), n in sorted(best.items()))
        + (" (none)" if not best else ""),
        "",
        "Engine alone, same run (one thread, batches of 64, compute only), real-time streams "
        "per core: "
        + ", ".join(f"{be} backend, {c} ms chunks: {v:.0f}" for (be, c), v in ceil.items()),
        f"Plot: {args.plot.relative_to(ROOT) if args.plot.is_relative_to(ROOT) else args.plot}",
    ]
    text = "\n".join(lines)
    print(text)
    append_results(
        args.results, "Real-time speech streams per server (bench_stream_capacity)", text
    )


if __name__ == "__main__":
    main()
