"""A long chat history sent at once: cold prefill with the prefix-state cache on vs off.

A client that already holds a conversation (a stateless chat client, or any request after its
states were evicted) sends M messages at once. With the cache on, the server stores a state
at the message ends it picks as insert points; each insert point ends a prefill piece, so
storing one at every message end cuts the prompt into one short piece per message. This
measures what that costs: the request's latency (to the full 1-token reply) on a server with
the cache on and on one with it off (`--prefix-cache-mb 0`), and, on the cache-on server, the
next turn (the same history + the reply + a new user message), which must hit.

Two live `dlr-serve` processes (the benchmark byte LM, one engine thread each), driven by the
official `openai` client; each history length runs `--repeats` times with fresh text (no hit
between repeats), medians.

    nice -n 10 .venv/bin/python -m benchmarks.bench_prefix_history [--results FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import openai

from benchmarks.harness import append_results, md_table
from benchmarks.load_server import Server, write_bench_models

MODEL = "bench-lm"


def history(messages: int, tag: str) -> list[dict]:
    out = [{"role": "system", "content": f"[{tag}] You are a patient assistant."}]
    for i in range(messages - 1):
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"role": role, "content": f"{tag}.{i}: " + "about the recurrent state " * 2})
    return out


def timed(c: openai.OpenAI, msgs: list[dict]) -> tuple[float, int, int, str]:
    t0 = time.perf_counter()
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1, temperature=0)
    dt = time.perf_counter() - t0
    u = r.usage
    return dt, u.prompt_tokens, u.prompt_tokens_details.cached_tokens, r.choices[0].message.content


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, nargs="+", default=[25, 100, 200])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--results", default=None)
    args = p.parse_args()
    if args.repeats < 1 or min(args.messages) < 2:
        p.error("--repeats >= 1 and --messages >= 2")
    tmp = tempfile.TemporaryDirectory()
    models = write_bench_models(Path(tmp.name))
    on = Server(models, 64, 1)
    off = Server(models, 64, 1, extra=["--prefix-cache-mb", "0"])
    con, coff = (openai.OpenAI(base_url=s.http + "/v1", api_key="x", max_retries=0, timeout=900)
                 for s in (on, off))  # fmt: skip
    rows = []
    try:
        for c in (con, coff):  # warm-up, not timed
            timed(c, [{"role": "user", "content": "warm-up"}])
        for m in args.messages:
            cold_on, cold_off, nxt, same = [], [], [], 0
            for r in range(args.repeats):
                msgs = history(m, f"m{m}r{r}")
                a = timed(con, msgs)
                b = timed(coff, msgs)
                cold_on.append(a[0])
                cold_off.append(b[0])
                same += a[3] == b[3]
                follow = [*msgs, {"role": "assistant", "content": a[3]},
                          {"role": "user", "content": "and then?"}]  # fmt: skip
                n = timed(con, follow)
                nxt.append(n[0])
                tokens, hit = n[1], n[2]
            on_ms, off_ms = statistics.median(cold_on) * 1000, statistics.median(cold_off) * 1000
            rows.append([m, b[1], f"{off_ms:.0f}", f"{on_ms:.0f}", f"{on_ms / off_ms:.2f}x",
                         f"{statistics.median(nxt) * 1000:.0f}", f"{hit} of {tokens}",
                         f"{same}/{args.repeats}"])  # fmt: skip
            print(rows[-1], flush=True)
    finally:
        on.stop()
        off.stop()
    body = md_table(
        ["messages", "prompt tokens", "cache off: cold ms", "cache on: cold ms", "on / off",
         "cache on: next turn ms", "next turn cached tokens", "same reply"],
        rows,
    )  # fmt: skip
    print(body)
    append_results(args.results, "Prefix-state cache: a long chat history sent at once "
                   "(bench_prefix_history)", body)  # fmt: skip


if __name__ == "__main__":
    main()
