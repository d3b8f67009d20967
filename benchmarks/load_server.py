"""Load generator for dlr-serve on loopback: concurrent speech streams and generations.

Starts `dlr-serve` as a subprocess (so its RSS can be read), then runs bounded phases:

- speech, real-time pace: N streams each send 20 ms PCM chunks every 20 ms for `--seconds`;
  per-chunk latency = first partial covering the chunk minus the chunk's send time; a run
  "stays real time" when p99 chunk latency < `--rt-p99-ms` and every final arrives within
  `--rt-final-ms` of the end message.
- speech, as fast as possible: N streams send all their audio at once; reports throughput and
  the real-time factor (wall time / audio time per stream).
- generation: M concurrent streamed /v1/generate requests; time to first token, inter-token
  latency, tokens per second.

Each phase reports the batch sizes the server saw (mean of dlr_batch_size per op) and the
server's RSS. Without --models-dir it writes two random models of a realistic size into a
temporary directory (speed does not depend on the weights).

Example: nice -n 10 .venv/bin/python benchmarks/load_server.py --streams 1 8 32 --gens 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHUNK_MS = 20


def write_bench_models(root: Path) -> Path:
    from dlr_runtime import DLRConfig, DLRModel, save_checkpoint

    speech = DLRConfig.preset("bench-speech")
    lm = DLRConfig.preset("bench-lm")
    save_checkpoint(DLRModel(speech, seed=0), root / "bench-speech")
    save_checkpoint(
        DLRModel(lm, seed=0),
        root / "bench-lm",
        tokenizer={"type": "bytes", "bos": 256, "eos": 257, "vocab_size": 258},
    )
    return root


class Server:
    def __init__(
        self, models_dir: Path, max_batch_size: int, threads: int, extra: list[str] | None = None
    ) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "server.cli",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--models-dir",
            str(models_dir),
            "--device",
            "cpu",
            "--max-batch-size",
            str(max_batch_size),
            "--torch-threads",
            str(threads),
            "--partial-interval-ms",
            "0",
            "--max-sessions",
            "1024",
            "--log-level",
            "warning",
            *(extra or []),
        ]
        self.proc = subprocess.Popen(cmd, cwd=ROOT)
        self.http = f"http://127.0.0.1:{self.port}"
        self.ws = f"ws://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.http + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def batch_means(self) -> dict[str, tuple[float, float]]:
        vals: dict[str, dict[str, float]] = {}
        for line in httpx.get(self.http + "/metrics").text.splitlines():
            for k in ("sum", "count"):
                if line.startswith(f"dlr_batch_size_{k}"):
                    op = line.split('op="')[1].split('"')[0]
                    vals.setdefault(op, {})[k] = float(line.split()[-1])
        return {op: (v.get("sum", 0.0), v.get("count", 0.0)) for op, v in vals.items()}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def mean_batch(before: dict, after: dict, op: str) -> float:
    s0, c0 = before.get(op, (0, 0))
    s1, c1 = after.get(op, (0, 0))
    return (s1 - s0) / (c1 - c0) if c1 > c0 else float("nan")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


async def speech_stream(url: str, seconds: float, paced: bool, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    n = int(16000 * CHUNK_MS / 1000)
    chunks = [
        (rng.standard_normal(n) * 0.1).astype("<f4").tobytes()
        for _ in range(int(seconds * 1000 / CHUNK_MS))
    ]
    sent: list[tuple[float, float]] = []  # (end_ms, send time)
    partials: list[tuple[float, float]] = []  # (audio_ms, recv time)
    async with websockets.connect(url + "/v1/speech/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "pcm_f32le"}))
        assert json.loads(await ws.recv())["type"] == "ready"

        async def reader() -> dict:
            while True:
                m = json.loads(await ws.recv())
                if m["type"] == "final":
                    return m
                if m["type"] != "partial":
                    raise RuntimeError(m)
                partials.append((m["audio_ms"], time.perf_counter()))

        task = asyncio.create_task(reader())
        t0 = time.perf_counter()
        for i, c in enumerate(chunks):
            if paced:
                await asyncio.sleep(max(0.0, t0 + i * CHUNK_MS / 1000 - time.perf_counter()))
            await ws.send(c)
            sent.append(((i + 1) * CHUNK_MS, time.perf_counter()))
        t_end = time.perf_counter()
        await ws.send(json.dumps({"type": "end"}))
        final = await task
        t_final = time.perf_counter()
    lat, j = [], 0
    for end_ms, ts in sent:
        while j < len(partials) and partials[j][0] < end_ms:
            j += 1
        if j < len(partials):
            lat.append(partials[j][1] - ts)
    return {
        "lat": lat,
        "final_wait": t_final - t_end,
        "wall": t_final - t0,
        "audio_s": final["audio_ms"] / 1000,
    }


async def speech_phase(srv: Server, n: int, seconds: float, paced: bool) -> dict:
    b0 = srv.batch_means()
    t0 = time.perf_counter()
    res = await asyncio.gather(*[speech_stream(srv.ws, seconds, paced, i) for i in range(n)])
    wall = time.perf_counter() - t0
    lat = [x * 1000 for r in res for x in r["lat"]]
    audio = sum(r["audio_s"] for r in res)
    return {
        "streams": n,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "final_wait_ms_max": max(r["final_wait"] for r in res) * 1000,
        "audio_s_per_s": audio / wall,
        "rtf": max(r["wall"] / r["audio_s"] for r in res),
        "batch_audio": mean_batch(b0, srv.batch_means(), "audio"),
        "rss_mb": srv.rss_mb(),
    }


async def gen_one(c: httpx.AsyncClient, i: int, tokens: int) -> list[float]:
    times = [time.perf_counter()]
    body = {
        "prompt": f"request {i}: " + "lorem ipsum " * 4,
        "max_new_tokens": tokens,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
    }
    async with c.stream("POST", "/v1/generate", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"type": "token"' in line:
                times.append(time.perf_counter())
    return times


async def gen_phase(srv: Server, m: int, tokens: int) -> dict:
    b0 = srv.batch_means()
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=srv.http, timeout=300) as c:
        res = await asyncio.gather(*[gen_one(c, i, tokens) for i in range(m)])
    wall = time.perf_counter() - t0
    ttft = [(r[1] - r[0]) * 1000 for r in res if len(r) > 1]
    itl = [(b - a) * 1000 for r in res for a, b in zip(r[1:], r[2:], strict=False)]
    n_tok = sum(len(r) - 1 for r in res)
    return {
        "requests": m,
        "tokens_per_s": n_tok / wall,
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "itl_p50_ms": pct(itl, 50),
        "itl_p99_ms": pct(itl, 99),
        "batch_decode": mean_batch(b0, srv.batch_means(), "decode"),
        "rss_mb": srv.rss_mb(),
    }


def machine() -> str:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--seconds", type=float, default=5.0, help="audio per stream")
    p.add_argument("--gens", type=int, nargs="+", default=[1, 16])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 1])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rt-p99-ms", type=float, default=200.0)
    p.add_argument("--rt-final-ms", type=float, default=500.0)
    p.add_argument("--budget-s", type=float, default=170.0, help="stop starting phases after")
    args = p.parse_args()
    start = time.monotonic()
    tmp = tempfile.TemporaryDirectory()
    models = args.models_dir or write_bench_models(Path(tmp.name))
    print(f"# machine: {machine()}\n# models: {models}\n")
    rows = []
    for bs in args.batch_sizes:
        srv = Server(models, bs, args.threads)
        try:
            for n in args.streams:
                if time.monotonic() - start > args.budget_s:
                    break
                r = asyncio.run(speech_phase(srv, n, args.seconds, paced=True))
                r["rt"] = r["p99_ms"] < args.rt_p99_ms and r["final_wait_ms_max"] < args.rt_final_ms
                rows.append(("speech-paced", bs, r))
                print(f"max_batch={bs} speech paced {json.dumps(r)}", flush=True)
                if not r["rt"]:
                    break
            for n in args.streams[-1:]:
                if time.monotonic() - start > args.budget_s:
                    break
                r = asyncio.run(speech_phase(srv, n, args.seconds, paced=False))
                rows.append(("speech-fast", bs, r))
                print(f"max_batch={bs} speech fast {json.dumps(r)}", flush=True)
            for m in args.gens:
                if time.monotonic() - start > args.budget_s:
                    break
                r = asyncio.run(gen_phase(srv, m, args.tokens))
                rows.append(("generate", bs, r))
                print(f"max_batch={bs} generate {json.dumps(r)}", flush=True)
        finally:
            srv.stop()
    print(
        "\n| phase | max batch | N | p50 ms | p99 ms | real time | throughput | RTF | mean batch | RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for phase, bs, r in rows:
        if phase.startswith("speech"):
            print(
                f"| {phase} | {bs} | {r['streams']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                f"{('yes' if r['rt'] else 'no') if 'rt' in r else '-'} | {r['audio_s_per_s']:.1f} audio s/s | "
                f"{r['rtf']:.3f} | {r['batch_audio']:.1f} | {r['rss_mb']:.0f} |"
            )
        else:
            print(
                f"| generate (TTFT / ITL) | {bs} | {r['requests']} | {r['ttft_p50_ms']:.1f} / "
                f"{r['itl_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} / {r['itl_p99_ms']:.1f} | - | "
                f"{r['tokens_per_s']:.0f} tok/s | - | {r['batch_decode']:.1f} | {r['rss_mb']:.0f} |"
            )


if __name__ == "__main__":
    main()
