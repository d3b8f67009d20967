"""Cost of a conversation turn vs conversation length: stateful WS session vs stateless HTTP.

Over WS /v1/generate/stream each turn appends `--append` characters and generates `--tokens`
tokens; the state carries the history, so a turn's latency should stay flat as the
conversation grows. The stateless baseline sends the whole transcript to POST /v1/generate on
every turn, so its prefill grows with the history. Reports the median turn latency per
block of turns for both.

Example: nice -n 10 .venv/bin/python benchmarks/turn_cost.py --turns 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import websockets

from benchmarks.load_server import Server, machine, write_bench_models


async def stateful(url: str, turns: int, append: str, tokens: int) -> tuple[list[float], list[str]]:
    lat, texts = [], []
    async with websockets.connect(url + "/v1/generate/stream") as ws:
        await ws.send(json.dumps({"type": "start"}))
        assert json.loads(await ws.recv())["type"] == "ready"
        for i in range(turns):
            t0 = time.perf_counter()
            await ws.send(json.dumps({"type": "append", "text": append}))
            await ws.send(
                json.dumps(
                    {
                        "type": "generate",
                        "max_new_tokens": tokens,
                        "temperature": 0.8,
                        "seed": i,
                        "stop": [],
                    }
                )
            )
            out = []
            while True:
                m = json.loads(await ws.recv())
                if m["type"] == "done":
                    break
                out.append(m["text"])
            lat.append(time.perf_counter() - t0)
            texts.append("".join(out))
    return lat, texts


def stateless(http: str, turns: int, append: str, tokens: int) -> list[float]:
    lat, history = [], ""
    with httpx.Client(base_url=http, timeout=600) as c:
        for i in range(turns):
            history += append
            t0 = time.perf_counter()
            r = c.post(
                "/v1/generate",
                json={"prompt": history, "max_new_tokens": tokens, "temperature": 0.8, "seed": i},
            )
            lat.append(time.perf_counter() - t0)
            history += r.json()["text"]
    return lat


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--append-chars", type=int, default=64)
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    models = args.models_dir or write_bench_models(Path(tmp.name))
    append = ("user says something; " * 10)[: args.append_chars]
    srv = Server(models, 64, args.threads)
    try:
        ws_lat, _ = asyncio.run(stateful(srv.ws, args.turns, append, args.tokens))
        http_lat = stateless(srv.http, args.turns, append, args.tokens)
    finally:
        srv.stop()
    per = args.turns // args.blocks
    print(f"# machine: {machine()}; models: {models}")
    print(f"# {args.turns} turns, each +{args.append_chars} chars, {args.tokens} new tokens\n")
    print("| turns | history chars (end) | WS session median ms | stateless HTTP median ms |")
    print("|---|---|---|---|")
    for b in range(args.blocks):
        lo, hi = b * per, (b + 1) * per
        chars = hi * (args.append_chars + args.tokens)
        print(
            f"| {lo + 1}-{hi} | ~{chars} | {np.median(ws_lat[lo:hi]) * 1000:.1f} | "
            f"{np.median(http_lat[lo:hi]) * 1000:.1f} |"
        )


if __name__ == "__main__":
    main()
