"""A long conversation through the OpenAI surface: per-turn cost vs turn number.

Three clients hold the same kind of conversation (each turn: a user message of `--chars`
characters, a reply of `--tokens` sampled tokens), driven by the official `openai` client
against a live `dlr-serve` (the benchmark byte LM, one engine thread):

- responses: `POST /v1/responses` with `previous_response_id`: each turn sends only its new
  message; the server continues from the stored state of the previous response;
- chat, stateless server: `POST /v1/chat/completions` re-sending the whole history every turn
  to a server with the prefix cache off (`--prefix-cache-mb 0`): every turn prefills the whole
  conversation, as a stateless server does;
- chat, prefix cache: the same client against a server with the prefix-state cache on: the
  history up to the last message is found in the cache (an insert point at the end of every
  message), so only the new message is prefilled, but the client still sends, and the
  server still renders and tokenises, the whole history.

Reported per block of turns: median turn latency (request to full reply) and prompt tokens
the server prefilled. The three run in turn (interleaved, one turn each), so they share the
machine's load; the ratios at the last block are the robust part. Writes a PNG plot.

    nice -n 10 .venv/bin/python -m benchmarks.bench_conversation --turns 1000 \\
        [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import openai

from benchmarks.harness import PLOTS, append_results, md_table
from benchmarks.load_server import Server, write_bench_models

MODEL = "bench-lm"


class Responses:
    name = "responses (stored state)"

    def __init__(self, http: str) -> None:
        self.c = openai.OpenAI(base_url=http + "/v1", api_key="x", max_retries=0, timeout=600)
        self.prev: str | None = None

    def turn(self, text: str, tokens: int, seed: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        r = self.c.responses.create(
            model=MODEL,
            input=text,
            previous_response_id=self.prev,
            max_output_tokens=tokens,
            temperature=0.8,
            extra_body={"seed": seed},  # (not a Responses API field; this server takes it)
        )
        dt = time.perf_counter() - t0
        self.prev = r.id
        return dt, r.usage.input_tokens - r.usage.input_tokens_details.cached_tokens


class Chat:
    def __init__(self, http: str, name: str) -> None:
        self.c = openai.OpenAI(base_url=http + "/v1", api_key="x", max_retries=0, timeout=600)
        self.name = name
        self.history: list[dict] = []

    def turn(self, text: str, tokens: int, seed: int) -> tuple[float, int]:
        self.history.append({"role": "user", "content": text})
        t0 = time.perf_counter()
        r = self.c.chat.completions.create(
            model=MODEL, messages=self.history, max_tokens=tokens, temperature=0.8, seed=seed
        )
        dt = time.perf_counter() - t0
        self.history.append({"role": "assistant", "content": r.choices[0].message.content})
        u = r.usage
        return dt, u.prompt_tokens - u.prompt_tokens_details.cached_tokens


def plot(turns: list[int], series: dict[str, list[float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, ys in series.items():
        ax.plot(turns, [y * 1000 for y in ys], marker="o", label=name)
    ax.set_xlabel("turn")
    ax.set_ylabel("median turn latency per block (ms)")
    ax.set_title("Per-turn cost of a long conversation")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=8, help="reply tokens per turn")
    p.add_argument("--chars", type=int, default=48, help="user message characters per turn")
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--results", default=None)
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    models = write_bench_models(Path(tmp.name))
    big = ["--max-prompt-chars", "100000000", "--max-request-bytes", "1000000000"]
    on = Server(models, 64, 1, extra=big)
    off = Server(models, 64, 1, extra=[*big, "--prefix-cache-mb", "0"])
    clients = [
        Responses(on.http),
        Chat(off.http, "chat, stateless server"),
        Chat(on.http, "chat, prefix cache"),
    ]
    lat: dict[str, list[float]] = {c.name: [] for c in clients}
    fed: dict[str, list[int]] = {c.name: [] for c in clients}
    msg = ("tell me more about the recurrent state; " * 8)[: args.chars]
    t_start = time.perf_counter()
    try:
        for i in range(args.turns):
            for c in clients:  # interleaved: the three see the same load
                dt, n = c.turn(f"{i}: {msg}", args.tokens, seed=i)
                lat[c.name].append(dt)
                fed[c.name].append(n)
            if (i + 1) % 50 == 0:
                last = ", ".join(f"{k} {v[-1] * 1000:.0f} ms" for k, v in lat.items())
                print(f"turn {i + 1}: {last}", flush=True)
    finally:
        on.stop()
        off.stop()
    wall = time.perf_counter() - t_start
    per = max(1, args.turns // args.blocks)
    rows, ends, series = [], [], {c.name: [] for c in clients}
    for b in range(0, args.turns, per):
        hi = min(b + per, args.turns)
        row: list[object] = [f"{b + 1}-{hi}"]
        for c in clients:
            med = statistics.median(lat[c.name][b:hi])
            series[c.name].append(med)
            row += [f"{med * 1000:.1f}", f"{statistics.median(fed[c.name][b:hi]):.0f}"]
        rows.append(row)
        ends.append(hi)
    headers = ["turns"]
    for c in clients:
        headers += [f"{c.name}: ms", "prefilled tokens"]
    first, last = {k: v[0] for k, v in series.items()}, {k: v[-1] for k, v in series.items()}
    lines = [
        md_table(headers, rows),
        "",
        f"{args.turns} turns, each a {args.chars}-character user message and a "
        f"{args.tokens}-token reply (temperature 0.8, seed = turn); {wall:.0f} s wall for all "
        "three clients.",
        "",
        "Last block / first block (growth of the per-turn cost): "
        + ", ".join(f"{k} {last[k] / first[k]:.2f}x" for k in series)
        + ". Last block, stateless chat / responses: "
        + f"{last['chat, stateless server'] / last['responses (stored state)']:.1f}x.",
    ]
    out = PLOTS / "conversation_turns.png"
    plot(ends, series, out)
    lines.append(f"\n![per-turn latency](plots/{out.name})")
    body = "\n".join(lines)
    print(body)
    append_results(args.results, "Long conversation: per-turn cost (bench_conversation)", body)


if __name__ == "__main__":
    main()
