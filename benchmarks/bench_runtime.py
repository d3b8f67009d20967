"""Runtime benchmark: batched step throughput, and chunk form vs the alternatives for audio.

1. step: tokens/s of `RecurrentModel.step` at batch 1, 8, 64, 256 for a small LM config;
   baseline = batch 1 (ratios show what batching buys).
2. streaming 16 kHz audio, per stream: samples/s of the chunk form at 20 / 100 / 500 ms chunks,
   against (a) the per-sample step loop and (b) naive streaming that re-runs the FFT forward on
   the whole buffered prefix after each chunk. Each path is timed on the chunk that arrives at
   stream positions 1 s, 10 s and 60 s (state carried up to there), so the table shows how the
   cost per chunk grows with the stream's length: flat for chunk and step, linear for naive.

    python -m benchmarks.bench_runtime [--quick] [--threads 1] [--results benchmarks/RESULTS.md]

Prints a table, writes a PNG plot next to the results file and appends a section to it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from dlr_runtime import DLRConfig, DLRModel, RecurrentModel, load_recurrent, to_recurrent

RATE = 16000
SPEECH_MODEL = Path(__file__).resolve().parent.parent / "models" / "speech-commands"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def timeit(fn, repeat: int, min_time: float = 0.05) -> float:
    """Median seconds per call of fn() (each sample loops until min_time has passed)."""
    fn()  # warm-up: caches, allocator
    samples = []
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        samples.append(dt / n)
    return statistics.median(samples)


def bench_step(quick: bool) -> list[dict]:
    cfg = DLRConfig.preset("bench-lm", d_state=64)
    rec = to_recurrent(DLRModel(cfg, seed=0).eval(), dtype=torch.complex64)
    rows = []
    for batch in (1, 8, 64, 256):
        state = rec.init_state(batch)
        tok = torch.randint(0, 258, (batch,))
        sec = timeit(lambda s=state, t=tok: rec.step(t, s), repeat=3 if quick else 5)
        rows.append({"batch": batch, "ms_per_step": sec * 1e3, "tokens_per_s": batch / sec})
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["vs_batch1"] = r["tokens_per_s"] / base
    return rows


def speech_model() -> tuple[RecurrentModel, DLRModel | None, str]:
    if SPEECH_MODEL.is_dir():
        rec = load_recurrent(SPEECH_MODEL, dtype=torch.complex64)
        from dlr_runtime import load_checkpoint

        model = load_checkpoint(SPEECH_MODEL)
        model = model if isinstance(model, DLRModel) else None
        return rec, model, "models/speech-commands"
    model = DLRModel(DLRConfig.preset("roofline-speech"), seed=0).eval()
    return to_recurrent(model, dtype=torch.complex64), model, "random model H=64 N=64 4 layers"


def bench_audio(quick: bool) -> tuple[list[dict], str]:
    rec, model, name = speech_model()
    assert model is not None, "naive baseline needs the training form"
    positions = (1, 10) if quick else (1, 10, 60)
    g = torch.Generator().manual_seed(0)
    stream = 0.1 * torch.randn(1, RATE * (max(positions) + 1), generator=g)
    rows = []
    for pos in positions:
        start = pos * RATE
        # state after `pos` seconds, computed once with the chunk form
        _, state = rec.chunk(stream[:, :start], rec.init_state(1))
        for ms in (20, 100, 500):
            n = RATE * ms // 1000
            piece = stream[:, start : start + n]
            t_chunk = timeit(lambda p=piece, s=state: rec.chunk(p, s), repeat=3)

            def naive(p=stream[:, : start + n]) -> None:
                with torch.no_grad():
                    model(p)  # re-run the whole prefix, keep the last scores

            t_naive = timeit(naive, repeat=1 if pos >= 10 else 3, min_time=0.0)

            def steps(p=piece, s=state) -> None:
                for t in range(p.shape[1]):
                    _, s = rec.step(p[:, t], s)

            t_step = timeit(steps, repeat=1, min_time=0.0) if ms == 20 else None
            rows.append(
                {
                    "position_s": pos,
                    "chunk_ms": ms,
                    "chunk_samples_per_s": n / t_chunk,
                    "step_samples_per_s": None if t_step is None else n / t_step,
                    "naive_samples_per_s": n / t_naive,
                }
            )
    # the step loop's per-sample cost does not depend on the chunk size: reuse the 20 ms figure
    for r in rows:
        if r["step_samples_per_s"] is None:
            r["step_samples_per_s"] = next(
                q["step_samples_per_s"]
                for q in rows
                if q["position_s"] == r["position_s"] and q["chunk_ms"] == 20
            )
        r["chunk_vs_step"] = r["chunk_samples_per_s"] / r["step_samples_per_s"]
        r["chunk_vs_naive"] = r["chunk_samples_per_s"] / r["naive_samples_per_s"]
        r["chunk_x_realtime"] = r["chunk_samples_per_s"] / RATE
    return rows, name


def table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[1] for c in cols) + " |"
    sep = "|" + "|".join("---:" for _ in cols) + "|"
    body = ["| " + " | ".join(format(r[c[0]], c[2]) for c in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def plot(audio: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for ms, style in ((20, "o-"), (100, "s-"), (500, "^-")):
        rs = [r for r in audio if r["chunk_ms"] == ms]
        xs = [r["position_s"] for r in rs]
        ax.plot(xs, [r["chunk_x_realtime"] for r in rs], style, label=f"chunk form, {ms} ms")
        ax.plot(
            xs,
            [r["naive_samples_per_s"] / RATE for r in rs],
            style,
            alpha=0.4,
            label=f"naive re-run, {ms} ms",
        )
    rs = [r for r in audio if r["chunk_ms"] == 20]
    ax.plot(
        [r["position_s"] for r in rs],
        [r["step_samples_per_s"] / RATE for r in rs],
        "k--",
        label="step loop",
    )
    ax.axhline(1.0, color="red", lw=0.8)
    ax.set(
        xscale="log", yscale="log", xlabel="stream position (s)", ylabel="x real time (one stream)"
    )
    ax.set_title("16 kHz streaming, one stream, one thread")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and no 60 s point")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--results", type=Path, default=None, help="append a section to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    step_rows = bench_step(args.quick)
    step_tab = table(
        step_rows,
        [("batch", "batch", "d"), ("ms_per_step", "ms/step", ".3f"), ("tokens_per_s", "tokens/s", ",.0f"),
         ("vs_batch1", "x batch 1", ".1f")],
    )  # fmt: skip
    print("step, LM H=128 N=64 4 layers, complex64\n" + step_tab)
    audio_rows, name = bench_audio(args.quick)
    audio_tab = table(
        audio_rows,
        [("position_s", "at stream s", "d"), ("chunk_ms", "chunk ms", "d"),
         ("chunk_samples_per_s", "chunk samples/s", ",.0f"), ("step_samples_per_s", "step loop samples/s", ",.0f"),
         ("naive_samples_per_s", "naive re-run samples/s", ",.0f"), ("chunk_vs_step", "chunk / step", ".0f"),
         ("chunk_vs_naive", "chunk / naive", ".1f"), ("chunk_x_realtime", "chunk x real time", ",.0f")],
    )  # fmt: skip
    print(f"\naudio, {name}\n" + audio_tab)
    elapsed = time.time() - t0
    if args.results:
        png = args.results.parent / "bench_runtime.png"
        plot(audio_rows, png)
        machine = f"{os.cpu_count()} cores, {cpu_name()}, torch {torch.__version__}, {args.threads} thread(s)"
        cmd = (
            "python -m benchmarks.bench_runtime"
            + (" --quick" if args.quick else "")
            + f" --results {args.results}"
        )
        section = (
            f"\n## Runtime: step batching and chunk vs alternatives (issue: dlr_runtime)\n\n"
            f"Command: `{cmd}`  \nMachine: {machine}; shared with other jobs, so absolute times are noisy; "
            f"compare the ratios. Took {elapsed:.0f} s. Plot: `{png.name}`.\n\n"
            f"Step, LM H=128 N=64 4 layers, complex64 state:\n\n{step_tab}\n\n"
            f"Audio streaming, one stream, {name}; each row times the chunk arriving at that stream position:\n\n"
            f"{audio_tab}\n"
        )
        with open(args.results, "a") as f:
            f.write(section)
        print(f"appended to {args.results}, plot {png}")


if __name__ == "__main__":
    main()
