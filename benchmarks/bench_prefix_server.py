"""Time to first token through the server: chat completions with a shared system prompt,
prefix-state cache on vs off.

Two live `dlr-serve` processes (the benchmark byte LM, one engine thread), one with the
prefix cache on and one with it off (`--prefix-cache-mb 0`, what a stateless server does).
At each shared-prefix length L a chat request is [system: L characters of text] + a fresh
user message; TTFT is measured by the official `openai` client, streaming with logprobs (so
the first token always makes a chunk), from the request to that first token chunk:

- cold: the cache-off server (full prefill every request);
- prefix hit: the cache-on server with the system prompt cached (a new user turn each call:
  only the user message is prefilled);
- full hit: the cache-on server, the same request again (the whole prompt's state cached).

Calls are interleaved (round-robin, medians over `--repeats`), so the three see the same load;
the ratio cold / hit is the robust part. Also reports `cached_tokens` as the server counts it.

    nice -n 10 .venv/bin/python -m benchmarks.bench_prefix_server [--results FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import openai

from benchmarks.harness import ROOT, append_results, md_table
from benchmarks.load_server import Server, write_bench_models

MODEL = "bench-lm"
LENGTHS = (64, 256, 1024, 4096, 16384)


def text(n: int) -> str:
    raw = "".join(p.read_text() for p in sorted(ROOT.glob("*.md"))).encode("ascii", "ignore")
    return (raw * (n // len(raw) + 1))[:n].decode()


def ttft(c: openai.OpenAI, messages: list[dict]) -> tuple[float, int]:
    """Seconds to the first token chunk, and the prompt tokens served from the cache."""
    t0 = time.perf_counter()
    first, cached = None, -1
    for chunk in c.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=2,
        temperature=0,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if first is None and chunk.choices and chunk.choices[0].logprobs:
            first = time.perf_counter() - t0
        if chunk.usage is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    assert first is not None
    return first, cached


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--results", default=None)
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    models = write_bench_models(Path(tmp.name))
    big = ["--max-prompt-chars", "10000000", "--max-request-bytes", "100000000"]
    on = Server(models, 64, 1, extra=big)
    off = Server(models, 64, 1, extra=[*big, "--prefix-cache-mb", "0"])
    kw = dict(api_key="x", max_retries=0, timeout=600)
    c_on = openai.OpenAI(base_url=on.http + "/v1", **kw)
    c_off = openai.OpenAI(base_url=off.http + "/v1", **kw)
    rows = []
    try:
        for n in args.lengths:
            system = {"role": "system", "content": text(n)}
            ttft(c_on, [system, {"role": "user", "content": "warm up"}])  # cache the prefix
            same = [system, {"role": "user", "content": "the same question"}]
            ttft(c_on, same)
            cold, hit, full, cached = [], [], [], []
            for r in range(args.repeats):
                fresh = [system, {"role": "user", "content": f"question number {r}"}]
                cold.append(ttft(c_off, fresh)[0])
                t, k = ttft(c_on, fresh)
                hit.append(t)
                cached.append(k)
                full.append(ttft(c_on, same)[0])
            mc, mh, mf = (statistics.median(x) * 1000 for x in (cold, hit, full))
            rows.append([n, f"{mc:.1f}", f"{mh:.1f}", f"{mf:.1f}", f"{mc / mh:.1f}x", min(cached)])
            print(rows[-1], flush=True)
    finally:
        on.stop()
        off.stop()
    body = md_table(
        [
            "shared prefix (chars = tokens)",
            "cold TTFT ms (cache off)",
            "prefix hit TTFT ms",
            "full hit TTFT ms",
            "cold / hit",
            "cached_tokens reported",
        ],
        rows,
    )
    print(body)
    append_results(
        args.results, "Prefix-state cache through the server: TTFT (bench_prefix_server)", body
    )


if __name__ == "__main__":
    main()
