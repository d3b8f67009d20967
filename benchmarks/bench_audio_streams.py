"""Concurrent real-time 16 kHz streams one CPU process sustains, per way of computing them.

Every stream delivers 100 ms of audio (1600 samples) per 100 ms. For B concurrent streams, one
"tick" processes one 100 ms piece of each stream; B streams are sustainable while a tick takes
less than 100 ms, and the capacity figure is B x 100 ms / (time per tick) (streams the
per-stream cost at that batch would allow). Ways:

- chunk (torch): `RecurrentModel.chunk` on (B, 1600), state carried.
- chunk (onnx): `OnnxBackend.chunk` (torch-side framing, ONNX frame-chunk graph).
- chunk (fused): `FusedAudioBackend.chunk` (the server's default for speech: the torch chunk
  form with each layer's recurrence in one numba call), when numba is installed.
- step loop: `RecurrentModel.step` once per sample (measured on 160 samples, x10).
- naive: re-run the FFT training forward on each stream's whole 1 s buffer every tick (what a
  model without a recurrent form does to stay current).

Model: models/speech-commands if present, else a random audio classifier (H=64, N=64, 4 layers,
frame_stride 160).

    nice -n 10 .venv/bin/python -m benchmarks.bench_audio_streams [--quick] [--results FILE]
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from benchmarks.bench_runtime import speech_model
from benchmarks.harness import PLOTS, append_results, machine, md_table, time_calls
from dlr_runtime.backends import fused_block
from dlr_runtime.backends.fused_audio import FusedAudioBackend
from dlr_runtime.backends.onnx import OnnxBackend

RATE = 16000
TICK = 0.1  # seconds of audio per stream per tick


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget", type=float, default=1.0, help="seconds of timing per point")
    ap.add_argument("--results", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rec, model, name = speech_model()
    assert model is not None, "the naive baseline needs the training form of the model"
    cfg = rec.config
    print(f"{machine()}\nmodel: {name} (H={cfg.d_model}, N={cfg.d_state}, {cfg.n_layers} layers)")
    onnx_be = OnnxBackend.from_recurrent(
        rec, tempfile.mkdtemp(prefix="bench-audio-"), max_chunk=16, threads=args.threads
    )
    fused_be = FusedAudioBackend(rec) if fused_block.AVAILABLE else None
    n = int(RATE * TICK)
    batches = [1, 16, 64] if args.quick else [1, 16, 64, 256]
    budget = 0.3 if args.quick else args.budget
    gen = torch.Generator().manual_seed(0)
    rows, series = [], {}
    for b in batches:
        audio = 0.1 * torch.randn(b, RATE, generator=gen)  # 1 s per stream
        _, st = rec.chunk(audio[:, : RATE // 2], rec.init_state(b))  # streams 0.5 s in
        ost = onnx_be.from_torch_state(st)
        piece = audio[:, RATE // 2 : RATE // 2 + n]
        ticks = {
            "chunk (torch)": time_calls(lambda p=piece, s=st: rec.chunk(p, s), budget)[0],
            "chunk (onnx)": time_calls(lambda p=piece, s=ost: onnx_be.chunk(p, s), budget)[0],
        }
        if fused_be is not None:
            t_fused, _ = time_calls(lambda p=piece, s=st: fused_be.chunk(p, s), budget)
            ticks["chunk (fused)"] = t_fused
        if b <= 64:

            def steps(p=piece[:, :160], s=st) -> None:
                for t in range(p.shape[1]):
                    _, s = rec.step(p[:, t], s)

            ticks["step loop"] = time_calls(steps, budget, min_calls=2)[0] * (n / 160)

            def naive(x=audio) -> None:
                with torch.no_grad():
                    model(x)

            ticks["naive FFT re-run"] = time_calls(naive, budget, min_calls=2)[0]
        for way, t in ticks.items():
            cap = b * TICK / t
            rows.append([way, b, t * 1e3, "yes" if t < TICK else "no", cap])
            series.setdefault(way, []).append((b, cap))
        print(
            f"batch {b}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in ticks.items()),
            flush=True,
        )

    best = {w: max(c for _, c in pts) for w, pts in series.items()}
    for r in rows:
        r.append(r[4] / best["naive FFT re-run"])
    headers = [
        "way", "streams (batch)", "ms per 100 ms tick", "real time?", "capacity (streams)",
        "capacity / best naive",
    ]  # fmt: skip
    table = md_table(headers, rows)
    summary = ", ".join(f"{w}: {c:.0f}" for w, c in best.items())
    print(table + f"\nbest capacity per way: {summary}")
    plot(series, PLOTS / "audio_streams.png")
    note = (
        f"Model: {name} (H={cfg.d_model}, N={cfg.d_state}, {cfg.n_layers} layers, frame_stride "
        f"{cfg.frame_stride}). One process, {args.threads} thread(s). Best capacity per way: "
        f"{summary}. Plot: benchmarks/plots/audio_streams.png"
    )
    append_results(
        args.results, "Streaming audio: concurrent 16 kHz streams", note + "\n\n" + table
    )


def plot(series: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for way, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=way)
    ax.axhline(100, color="gray", ls="--", lw=1, label="goal: 100 streams")
    ax.set(
        xscale="log", yscale="log", xlabel="streams batched per tick", ylabel="capacity (streams)"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
