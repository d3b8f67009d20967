"""A long conversation through the OpenAI surface: per-turn cost vs turn number.

Each turn of the conversation is a user message of `--chars` characters and a reply of
`--tokens` sampled tokens, driven by the official `openai` client against live `dlr-serve`
processes (the benchmark byte LM, one engine thread each):

- responses: `POST /v1/responses` with `previous_response_id`: each turn sends only its new
  message; the server continues from the stored state of the previous response. Every one of
  the `--turns` turns is run and timed.
- chat, stateless server: `POST /v1/chat/completions` re-sending the whole history to a
  server with the prefix cache off (`--prefix-cache-mb 0`): every turn prefills the whole
  conversation, as a stateless server does. Run at every turn of 1000 this costs hours here
  (the history grows ~90 tokens a turn), so it is measured at sampled turns
  (`--samples`, evenly spaced from 1 to `--turns`): at turn k it is sent exactly the history a
  chat client holds at turn k (the k-1 earlier user messages, the k-1 replies of the
  conversation so far, then a k-th user message of the same length as the responses client's,
  its text varied per repeat so no repeat hits an earlier one), timed `--repeats` times
  (median).
- chat, prefix cache: the same requests to a server with the prefix-state cache on, after one
  untimed request holding the history up to the (k-1)-th reply, so the cache holds the states
  at the end of every earlier message, as it does in a running conversation: only the new
  message is prefilled, but the client still sends, and the server still renders and
  tokenises, the whole history. Its reply must equal the stateless server's (same messages,
  same seed): the run counts the matches.

The sampled measurements run at their turn, between two responses turns, so all share the
machine's load of that moment. Reported: responses per block of turns (median latency,
prompt tokens prefilled), the sampled turns, and a least-squares line (latency vs turn) per
client whose slope is the per-turn growth of the cost. Writes
benchmarks/plots/conversation_turns.png.

    nice -n 10 .venv/bin/python -m benchmarks.bench_conversation --turns 1000 \\
        [--samples 11] [--repeats 2] [--results benchmarks/RESULTS.md]
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
RESP, CACHED, STATELESS = "responses (stored state)", "chat, prefix cache", "chat, stateless server"


def client(http: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=http + "/v1", api_key="x", max_retries=0, timeout=600)


class Responses:
    def __init__(self, http: str) -> None:
        self.c = client(http)
        self.prev: str | None = None

    def turn(self, text: str, tokens: int, seed: int) -> tuple[float, int, str]:
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
        return dt, r.usage.input_tokens - r.usage.input_tokens_details.cached_tokens, r.output_text


def chat(c: openai.OpenAI, messages: list[dict], tokens: int, seed: int) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    r = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=tokens, temperature=0.8, seed=seed
    )
    dt = time.perf_counter() - t0
    u = r.usage
    return dt, u.prompt_tokens - u.prompt_tokens_details.cached_tokens, r.choices[0].message.content


def sample_turns(turns: int, samples: int) -> list[int]:
    """`samples` turn numbers (1-based) evenly spaced from 1 to `turns`."""
    if samples <= 1:
        return [turns]
    return sorted({round(1 + i * (turns - 1) / (samples - 1)) for i in range(samples)})


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept of ys against xs."""
    if len(xs) < 2:
        return float("nan"), float("nan")
    r = statistics.linear_regression(xs, ys)
    return r.slope, r.intercept


def plot(
    resp: list[float],
    sampled: list[int],
    chats: dict[str, list[float]],
    lines: dict[str, tuple[float, float]],
    out: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    turns = list(range(1, len(resp) + 1))
    for ax, scale in zip(axes, ("linear", "log"), strict=True):
        ax.plot(turns, [y * 1000 for y in resp], ".", ms=2, alpha=0.5, label=f"{RESP} (every turn)")
        for (name, ys), mark in zip(chats.items(), ("s", "^"), strict=True):
            ax.plot(sampled, [y * 1000 for y in ys], mark, label=f"{name} (sampled turns)")
        for name, (slope, icpt) in lines.items():
            xs = [1, len(resp)]
            ax.plot(
                xs,
                [max(1e-3, icpt + slope * x) * 1000 for x in xs],
                "--",
                lw=1,
                label=f"fit {name}: {slope * 1000:+.3f} ms/turn",
            )
        ax.set_yscale(scale)
        ax.set_xlabel("turn")
        ax.set_ylabel("turn latency (ms)")
        ax.set_title(f"Per-turn cost of a long conversation ({scale} y)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=8, help="reply tokens per turn")
    p.add_argument("--chars", type=int, default=48, help="user message characters per turn")
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--samples", type=int, default=11, help="turns at which chat is measured")
    p.add_argument("--repeats", type=int, default=2, help="timed chat requests per sample")
    p.add_argument("--results", default=None)
    args = p.parse_args()
    if min(args.turns, args.blocks, args.repeats, args.samples) < 1:
        p.error("--turns, --blocks, --samples and --repeats must be at least 1")
    tmp = tempfile.TemporaryDirectory()
    models = write_bench_models(Path(tmp.name))
    big = ["--max-prompt-chars", "100000000", "--max-prompt-tokens", "100000000",
           "--max-request-bytes", "1000000000"]  # fmt: skip
    on = Server(models, 64, 1, extra=big)
    off = Server(models, 64, 1, extra=[*big, "--prefix-cache-mb", "0"])
    resp, cached, stateless = Responses(on.http), client(on.http), client(off.http)
    history: list[dict] = []  # what a chat client holds: user messages and the replies
    lat: list[float] = []
    fed: list[int] = []
    at = sample_turns(args.turns, args.samples)
    s_lat: dict[str, list[float]] = {CACHED: [], STATELESS: []}
    s_fed: dict[str, list[int]] = {CACHED: [], STATELESS: []}
    same = total = 0
    msg = ("tell me more about the recurrent state; " * 8)[: args.chars]
    t_start = time.perf_counter()
    try:
        for c in (cached, stateless):  # warm-up (first-call costs), not timed
            chat(c, [{"role": "user", "content": "warm-up"}], args.tokens, seed=0)
        Responses(on.http).turn("warm-up", args.tokens, seed=0)
        for i in range(args.turns):
            text = f"{i}: {msg}"
            dt, n, reply = resp.turn(text, args.tokens, seed=i)
            lat.append(dt)
            fed.append(n)
            if i + 1 in at:
                if history:  # the cache holds every earlier message's end, as in a chat
                    chat(cached, history, 1, seed=i)
                got: dict[str, list[tuple[float, int, str]]] = {CACHED: [], STATELESS: []}
                for r in range(args.repeats):
                    u = f"{i}.{r}: {msg}"[: len(text)]  # (not the responses text: no hit on it)
                    msgs = [*history, {"role": "user", "content": u}]
                    got[CACHED].append(chat(cached, msgs, args.tokens, seed=i))
                    got[STATELESS].append(chat(stateless, msgs, args.tokens, seed=i))
                for k, runs in got.items():
                    s_lat[k].append(statistics.median(x[0] for x in runs))
                    s_fed[k].append(runs[0][1])
                for a, b in zip(got[CACHED], got[STATELESS], strict=True):
                    same += a[2] == b[2]
                    total += 1
                print(
                    f"turn {i + 1}: stateless {s_lat[STATELESS][-1] * 1000:.0f} ms "
                    f"({s_fed[STATELESS][-1]} tokens), prefix cache "
                    f"{s_lat[CACHED][-1] * 1000:.0f} ms ({s_fed[CACHED][-1]} tokens), "
                    f"{time.perf_counter() - t_start:.0f} s",
                    flush=True,
                )
            history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
            if (i + 1) % 100 == 0:
                print(f"turn {i + 1}: responses {lat[-1] * 1000:.0f} ms", flush=True)
    finally:
        on.stop()
        off.stop()
    wall = time.perf_counter() - t_start
    per = max(1, -(-args.turns // args.blocks))
    rows = []
    for b in range(0, args.turns, per):
        hi = min(b + per, args.turns)
        rows.append(
            [
                f"{b + 1}-{hi}",
                f"{statistics.median(lat[b:hi]) * 1000:.1f}",
                f"{statistics.median(fed[b:hi]):.0f}",
            ]
        )
    s_rows = [
        [
            k,
            f"{lat[k - 1] * 1000:.1f}",
            f"{s_lat[STATELESS][j] * 1000:.1f}",
            s_fed[STATELESS][j],
            f"{s_lat[CACHED][j] * 1000:.1f}",
            s_fed[CACHED][j],
            f"{s_lat[STATELESS][j] / lat[k - 1]:.1f}x",
        ]
        for j, k in enumerate(at)
    ]
    lines = {RESP: fit(list(range(1, args.turns + 1)), lat)}
    for k in (STATELESS, CACHED):
        lines[k] = fit(at, s_lat[k])
    tok_slope = fit(at, s_fed[STATELESS])[0]

    def pred(k: str, x: int) -> float:
        return lines[k][1] + lines[k][0] * x

    fits = [
        [k, f"{sl * 1000:+.4f}", f"{c * 1000:.1f}", f"{pred(k, 1) * 1000:.1f}",
         f"{pred(k, args.turns) * 1000:.1f}"]
        for k, (sl, c) in lines.items()
    ]  # fmt: skip
    body = "\n".join(
        [
            f"{RESP}, every turn (block medians):",
            "",
            md_table(["turns", "ms", "prefilled tokens"], rows),
            "",
            f"Chat at sampled turns (median of {args.repeats} requests each, the history that "
            "turn carries; the responses turn at the same turn for comparison):",
            "",
            md_table(
                [
                    "turn",
                    f"{RESP} ms",
                    f"{STATELESS} ms",
                    "prefilled tokens",
                    f"{CACHED} ms",
                    "prefilled tokens",
                    "stateless / responses",
                ],
                s_rows,
            ),  # fmt: skip
            "",
            f"Least-squares lines, turn latency vs turn number ({RESP}: all {args.turns} "
            "turns; chat: the sampled turns):",
            "",
            md_table(
                [
                    "client",
                    "slope ms/turn",
                    "intercept ms",
                    "fit at turn 1 ms",
                    f"fit at turn {args.turns} ms",
                ],
                fits,
            ),  # fmt: skip
            "",
            f"{args.turns} turns, each a {args.chars}-character user message and a "
            f"{args.tokens}-token reply (temperature 0.8, seed = turn); {wall:.0f} s wall. "
            f"The stateless prompt grows {tok_slope:.1f} tokens per turn. Prefix-cache and "
            f"stateless replies equal in {same} of {total} sampled requests.",
        ]
    )
    out = PLOTS / "conversation_turns.png"
    plot(lat, at, {STATELESS: s_lat[STATELESS], CACHED: s_lat[CACHED]}, lines, out)
    body += f"\n\n![per-turn latency](plots/{out.name})"
    print(body)
    append_results(args.results, "Long conversation: per-turn cost (bench_conversation)", body)


if __name__ == "__main__":
    main()
