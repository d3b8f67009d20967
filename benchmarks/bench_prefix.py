"""Time to first token vs shared-prefix length, with the prefix-state cache on and off.

The shipped byte LM (engine on the torch backend, one thread). At each shared-prefix length L
(64 .. 32K tokens) a prompt is bos + L tokens of shared text (a system prompt / a conversation's
history) + a fresh 32-token user turn; its time to first token is prefill + sampling the first
token (greedy), measured in three ways in the same run:

- cold: `engine.prefill` of the whole prompt (what a stateless server does every request);
- prefix hit: `prefill_cached` with the state after the shared part in the cache (a new user
  turn each call, so only the 32 new tokens are prefilled);
- full hit: the same prompt again (its end state and logits are cached: no prefill at all).

The three are called in turn (round-robin, medians), so each sees the same load.

Also: the cost of forking one slot's state into n new slots (time and bytes), which is what
n > 1 and session forks pay instead of n prefills. Ratios (cold / hit) come from the same run.

    nice -n 10 .venv/bin/python -m benchmarks.bench_prefix [--max-len 32768] [--results FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.harness import PLOTS, ROOT, append_results, machine, md_table, time_calls
from dlr_runtime import load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine, SamplingParams, sample_token
from dlr_runtime.engine.cached_prefill import prefill_cached
from dlr_runtime.engine.prefix_cache import PrefixCache
from dlr_runtime.engine.slot_state import fork

SUFFIX = 32
LENGTHS = (64, 256, 1024, 4096, 16384, 32768)


def text_tokens(n: int) -> list[int]:
    """n bytes of real text (the repository's docs, repeated)."""
    raw = b"".join(p.read_bytes() for p in sorted(ROOT.glob("*.md")))
    return list((raw * (n // len(raw) + 1))[:n])


GREEDY = SamplingParams(temperature=0, max_tokens=1)


def ttft(eng: Engine, cache: PrefixCache | None, prompt: list[int]) -> int:
    """Prefill a prompt in a fresh slot (through `cache` if given); the first greedy token."""
    s = eng.open()
    try:
        res = prefill_cached(eng, cache, [s], [prompt])
        return sample_token(res.logits[0], GREEDY, GREEDY.generator())
    finally:
        eng.close(s)


def interleaved(fns: list, budget_s: float, min_rounds: int = 3) -> list[float]:
    """Median seconds per call of each fn, calling them in turn (after one warm-up round) so
    that every variant sees the same load of the shared machine."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < min_rounds or time.perf_counter() - start < budget_s:
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def fork_and_free(eng: Engine, src: int, n: int) -> None:
    for s in fork(eng, src, n).slots:
        eng.close(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-len", type=int, default=LENGTHS[-1])
    ap.add_argument("--budget-s", type=float, default=2.0, help="time budget per measurement")
    ap.add_argument("--results", default=None)
    ap.add_argument("--png", default=str(PLOTS / "prefix_ttft.png"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rec = load_recurrent(ROOT / "models" / "byte-lm")
    eng = Engine(make_backend(rec, "torch"), "byte-lm", 32, metadata=rec.checkpoint_metadata)
    g = torch.Generator().manual_seed(0)
    print(machine())

    def fresh_turn() -> list[int]:
        return torch.randint(32, 127, (SUFFIX,), generator=g).tolist()

    rows, series = [], {"cold": [], "prefix hit": [], "full hit": []}
    lengths = [n for n in LENGTHS if n <= args.max_len]
    for n in lengths:
        shared = [256, *text_tokens(n)]
        cache = PrefixCache(256 << 20)
        slot = eng.open()
        prefill_cached(eng, cache, [slot], [shared])  # what an earlier request left behind
        eng.close(slot)

        repeat = shared + fresh_turn()
        ttft(eng, cache, repeat)  # cache the whole prompt once
        cold, hit, full = interleaved(
            [
                lambda p=shared: ttft(eng, None, p + fresh_turn()),
                lambda c=cache, p=shared: ttft(eng, c, p + fresh_turn()),
                lambda c=cache, p=repeat: ttft(eng, c, p),
            ],
            args.budget_s,
        )
        st = cache.stats()
        rows.append(
            [n, cold * 1e3, hit * 1e3, full * 1e3, cold / hit, cold / full, st.bytes / 2**20]
        )
        for name, v in zip(series, (cold, hit, full), strict=True):
            series[name].append(v)
        print(md_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)

    fork_rows = []
    src = eng.open()
    eng.prefill([src], [[256, *text_tokens(64)]])
    for k in (1, 4, 16):
        sec, _ = time_calls(lambda k=k: fork_and_free(eng, src, k), 0.5, 5, 200)
        fork_rows.append([k, sec * 1e6, k * eng.state_bytes_per_session() / 1024])
    eng.close(src)

    table = md_table(HEADERS, rows)
    ftable = md_table(["forks n", "time (us, incl. open/close)", "bytes copied (KiB)"], fork_rows)
    body = (
        f"Byte LM (state {eng.state_bytes_per_session() / 1024:.0f} KiB per session), torch "
        f"backend, 1 thread; prompt = bos + shared prefix + a new {SUFFIX}-token turn; TTFT = "
        f"prefill + first greedy token (no server).\n\n{table}\n\nFork of one slot:\n\n{ftable}\n"
        f"\n![prefix TTFT]({os.path.relpath(args.png, ROOT / 'benchmarks')})\n"
    )
    print(body)
    plot(lengths, series, args.png)
    append_results(args.results, "Prefix-state cache: time to first token", body)


HEADERS = [
    "shared prefix (tokens)",
    "cold TTFT (ms)",
    "prefix-hit TTFT (ms)",
    "full-hit TTFT (ms)",
    "cold / prefix hit",
    "cold / full hit",
    "cache (MiB)",
]


def plot(lengths: list[int], series: dict[str, list[float]], path: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, vals in series.items():
        ax.loglog(lengths, [v * 1e3 for v in vals], marker="o", label=name)
    ax.set_xlabel("shared prefix length (tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title("byte LM, 1 thread: prefix-state cache on / off")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
