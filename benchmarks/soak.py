"""Soak test for dlr-serve on loopback: N speech sessions at real-time pace plus M text
generation sessions for a fixed duration; stops by itself.

Starts `dlr-serve` as a subprocess (so its RSS can be read). Every speech session repeatedly
streams one of 8 seeded clips (`--clip-s` seconds, 100 ms pcm_s16le messages sent at
real-time pace), ends it and checks the final; every generation session repeatedly opens a
`/v1/generate/stream` session, appends a prompt and generates `--tokens` seeded tokens. It
reports:

- errors (error messages, unexpected closes, timeouts), lost or duplicated messages (every
  server message carries `seq`: they must be 1, 2, 3, ... per session), and results that
  differ between repetitions of the same clip or prompt (state leakage or corruption);
- latency: speech, per 100 ms message, from sending it to the first partial that covers it
  (includes the server's `partial_interval_ms` throttle), and end -> final; generation, time
  to first token and inter-token gaps; p50 / p99;
- server RSS sampled every 2 s; growth = last sample vs the first sample after warm-up
  (`--warmup-s`).

Without --models-dir it writes the tiny test-size models (d_model 16) into a temporary
directory; `--models-dir models` uses the shipped models.

Example: nice -n 10 .venv/bin/python benchmarks/soak.py --speech 200 --gen 20 --duration 300
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
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHUNK_S = 0.1
RATE = 16000
N_CLIPS = 8


def write_tiny_models(root: Path) -> Path:
    from dlr_runtime import DLRConfig, DLRModel, save_checkpoint

    speech = DLRConfig.preset("tiny-speech", sample_rate=RATE)
    lm = DLRConfig.preset("tiny-lm", init="omega")
    save_checkpoint(DLRModel(speech, seed=0), root / "soak-speech")
    tok = {"type": "bytes", "bos": 256, "eos": 257, "vocab_size": 258}
    save_checkpoint(DLRModel(lm, seed=0), root / "soak-lm", tokenizer=tok)
    return root


class ServerProc:
    def __init__(self, models_dir: Path, sessions: int, log: Path, extra: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "server.cli", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--models-dir", str(models_dir), "--device", "cpu", "--log-level", "warning"]
        cmd += ["--max-sessions", str(sessions), *extra]
        self.log = open(log, "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=self.log)
        self.http = f"http://127.0.0.1:{self.port}"
        self.ws = f"ws://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dlr-serve exited ({log})")
            try:
                if httpx.get(self.http + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not start")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@dataclass
class Stats:
    errors: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    mismatched: int = 0
    chunk_lat: list[float] = field(default_factory=list)
    final_lat: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    streams: int = 0
    generations: int = 0
    audio_s: float = 0.0
    tokens: int = 0
    reference: dict = field(default_factory=dict)

    def check_seq(self, seqs: list[int]) -> None:
        expect = 1
        for s in seqs:
            if s < expect:
                self.duplicated += 1
            else:
                self.lost += s - expect
                expect = s + 1

    def same(self, key, value, close) -> None:
        ref = self.reference.setdefault(key, value)
        if not close(ref, value):
            self.mismatched += 1


def clip(i: int, seconds: float) -> bytes:
    rng = np.random.default_rng(i)
    t = np.arange(int(RATE * seconds)) / RATE
    x = 0.3 * np.sin(2 * np.pi * (150 + 60 * i) * t) + 0.05 * rng.standard_normal(t.size)
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


async def speech_session(url: str, stop_at: float, k: int, clips: list[bytes], st: Stats) -> None:
    step = int(RATE * CHUNK_S) * 2
    while time.monotonic() < stop_at:
        data = clips[k % len(clips)]
        try:
            async with websockets.connect(
                url + "/v1/speech/stream", open_timeout=30, compression=None
            ) as ws:
                await ws.send(json.dumps({"type": "start", "sample_rate": RATE}))
                ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if ready.get("type") != "ready":
                    st.errors.append(f"speech start: {ready}")
                    await asyncio.sleep(1)
                    continue
                sent: list[tuple[float, float]] = []  # (audio ms covered, send time)
                msgs: list[tuple[float, dict]] = []

                async def reader(msgs=msgs):
                    while True:
                        m = json.loads(await ws.recv())
                        msgs.append((time.monotonic(), m))
                        if m["type"] != "partial":
                            return m

                task = asyncio.create_task(reader())
                t0 = time.monotonic()
                for j, i in enumerate(range(0, len(data), step)):
                    due = t0 + j * CHUNK_S
                    if due > time.monotonic():
                        await asyncio.sleep(due - time.monotonic())
                    await ws.send(data[i : i + step])
                    sent.append((min(len(data), i + step) / 2 / RATE * 1000, time.monotonic()))
                    if task.done():
                        break
                t_end = time.monotonic()
                await ws.send(json.dumps({"type": "end"}))
                final = await asyncio.wait_for(task, 60)
        except Exception as e:  # noqa: BLE001  (counted, the session goes on)
            st.errors.append(f"speech: {type(e).__name__}: {e}")
            await asyncio.sleep(0.5)
            continue
        if final.get("type") != "final":
            st.errors.append(f"speech: {final}")
            continue
        st.final_lat.append(msgs[-1][0] - t_end)
        st.check_seq([m["seq"] for _, m in msgs])
        partials = [(t, m["audio_ms"]) for t, m in msgs[:-1]]
        p = 0
        for ms, t in sent[:-1]:
            while p < len(partials) and partials[p][1] < ms:
                p += 1
            if p < len(partials):
                st.chunk_lat.append(partials[p][0] - t)
        if abs(final["audio_ms"] - len(data) / 2 / RATE * 1000) > 0.05:
            st.errors.append(f"speech: final covers {final['audio_ms']} ms")
        st.same(
            ("clip", k % len(clips)),
            final,
            lambda a, b: a["label"] == b["label"] and abs(a["score"] - b["score"]) < 2e-6,
        )
        st.streams += 1
        st.audio_s += len(data) / 2 / RATE
        k += 1


async def gen_session(url: str, stop_at: float, k: int, tokens: int, st: Stats) -> None:
    while time.monotonic() < stop_at:
        prompt = f"soak prompt {k % 5}: "
        try:
            async with websockets.connect(
                url + "/v1/generate/stream", open_timeout=30, compression=None
            ) as ws:
                await ws.send(json.dumps({"type": "start"}))
                ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if ready.get("type") != "ready":
                    st.errors.append(f"gen start: {ready}")
                    await asyncio.sleep(1)
                    continue
                await ws.send(json.dumps({"type": "append", "text": prompt}))
                t0 = time.monotonic()
                gen = {
                    "type": "generate",
                    "max_new_tokens": tokens,
                    "seed": k % 5,
                    "temperature": 0.8,
                }
                await ws.send(json.dumps(gen))
                msgs, times = [], []
                while True:
                    m = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    msgs.append(m)
                    times.append(time.monotonic())
                    if m["type"] != "token":
                        break
        except Exception as e:  # noqa: BLE001
            st.errors.append(f"gen: {type(e).__name__}: {e}")
            await asyncio.sleep(0.5)
            continue
        if msgs[-1]["type"] != "done":
            st.errors.append(f"gen: {msgs[-1]}")
            continue
        st.check_seq([m["seq"] for m in msgs])
        st.ttft.append(times[0] - t0)
        st.itl.extend(b - a for a, b in zip(times[:-1], times[1:], strict=False))
        text = "".join(m["text"] for m in msgs[:-1])
        st.same(("prompt", k % 5), text, lambda a, b: a == b)
        st.generations += 1
        st.tokens += msgs[-1]["usage"]["completion_tokens"]
        k += 1


def pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)) * 1000, 1) if xs else float("nan")


async def run(args, srv: ServerProc) -> dict:
    st = Stats()
    clips = [clip(i, args.clip_s) for i in range(N_CLIPS)]
    start = time.monotonic()
    stop_at = start + args.duration
    rss: list[tuple[float, float]] = []

    async def sampler():
        while time.monotonic() < stop_at + 5:
            rss.append((time.monotonic() - start, srv.rss_mb()))
            await asyncio.sleep(2)

    async def staggered(coro, delay):
        await asyncio.sleep(delay)
        await coro

    n = args.speech + args.gen
    tasks = [
        staggered(
            speech_session(srv.ws, stop_at, i, clips, st), i * args.clip_s / max(1, args.speech)
        )
        for i in range(args.speech)
    ]
    tasks += [
        staggered(gen_session(srv.ws, stop_at, i, args.tokens, st), i * 0.05)
        for i in range(args.gen)
    ]
    samp = asyncio.create_task(sampler())
    await asyncio.wait_for(asyncio.gather(*tasks), args.duration + 180)
    samp.cancel()
    warm = [r for t, r in rss if t >= args.warmup_s] or [r for _, r in rss]
    return {
        "speech_sessions": args.speech,
        "gen_sessions": args.gen,
        "concurrent": n,
        "duration_s": args.duration,
        "wall_s": round(time.monotonic() - start, 1),
        "streams_completed": st.streams,
        "audio_s": round(st.audio_s, 1),
        "generations_completed": st.generations,
        "tokens": st.tokens,
        "errors": len(st.errors),
        "error_samples": st.errors[:5],
        "lost_messages": st.lost,
        "duplicated_messages": st.duplicated,
        "mismatched_results": st.mismatched,
        "speech_chunk_latency_ms": {
            "p50": pct(st.chunk_lat, 50),
            "p99": pct(st.chunk_lat, 99),
            "n": len(st.chunk_lat),
        },
        "speech_final_latency_ms": {"p50": pct(st.final_lat, 50), "p99": pct(st.final_lat, 99)},
        "ttft_ms": {"p50": pct(st.ttft, 50), "p99": pct(st.ttft, 99)},
        "itl_ms": {"p50": pct(st.itl, 50), "p99": pct(st.itl, 99)},
        "rss_mb": {
            "after_warmup": round(warm[0], 1),
            "end": round(warm[-1], 1),
            "max": round(max(warm), 1),
        },
        "rss_growth_pct": round((warm[-1] - warm[0]) / warm[0] * 100, 2),
    }


def machine() -> str:
    load = os.getloadavg()[0]
    return f"{platform.processor() or platform.machine()}, nproc {os.cpu_count()}, load {load:.1f} at start"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speech", type=int, default=200, help="concurrent speech sessions")
    p.add_argument("--gen", type=int, default=20, help="concurrent generation sessions")
    p.add_argument("--duration", type=float, default=300, help="seconds of load")
    p.add_argument("--warmup-s", type=float, default=30, help="RSS growth is measured after this")
    p.add_argument("--clip-s", type=float, default=5.0, help="seconds per speech stream")
    p.add_argument("--tokens", type=int, default=32, help="tokens per generation")
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the report here too")
    p.add_argument("server_args", nargs="*", help="extra dlr-serve flags (after --)")
    args = p.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    models = args.models_dir or write_tiny_models(Path(tmp.name))
    sessions = 2 * (args.speech + args.gen) + 16
    srv = ServerProc(models, sessions, Path(tmp.name) / "server.log", args.server_args)
    try:
        report = asyncio.run(run(args, srv))
    finally:
        srv.stop()
        log = (Path(tmp.name) / "server.log").read_text(errors="replace")[-2000:]
        tmp.cleanup()
    report["machine"] = machine()
    report["models"] = str(args.models_dir or "tiny (d_model 16, 2 layers)")
    report["server_log_tail"] = log[-500:]
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
