"""Roofline: FLOPs and bytes per call of the decode step and the audio chunk, vs measured peaks.

Peaks are measured in the same run on the same threads: a large float32 matmul (GFLOP/s) and a
large tensor copy (GB/s, read + write). For each call we count (formulas below, complex64
state, float32 weights):

  decode step, B streams, L layers, width H, state N, vocab V (per stream per layer):
    FLOPs  ~ 14 H N (complex update 10 + real part of C x 4) + 4 H^2 (H -> 2H projection)
             + ~20 H (norm, GELU, GLU, residual); plus the head 2 H V + 8 H
    bytes  = weights once (lam, B, C: 3 x 8 H N per layer, projection 4 (2H^2 + 2H), head 4 V H)
             + state read and written (2 x 8 L H N per stream)
  audio chunk, B streams x T samples = F frames of S samples (Toeplitz path, F <= 64):
    FLOPs  ~ per frame 2 S H (encoder) + per layer [2 H F (conv row) + 8 N H (two Vandermonde
             matmuls) + 4 H^2 + ~20 H] + per chunk per layer 20 H N (state update) + head
    bytes  = weights + Toeplitz/Vandermonde tables + state r/w + samples in + scores out
             + activations (about 8 H F floats per layer per stream read or written)

The achieved GFLOP/s and GB/s are these counts over the measured time; the attainable bound is
min(peak FLOP/s, intensity x peak bandwidth). Small calls are overhead-bound (Python and kernel
launches): far under both roofs, which this table makes visible.

    nice -n 10 .venv/bin/python -m benchmarks.bench_roofline [--quick] [--results FILE]
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from benchmarks.harness import PLOTS, append_results, machine, md_table, time_calls
from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends import fused_block
from dlr_runtime.backends.fused import FusedBackend, fused_supported
from dlr_runtime.backends.fused_audio import FusedAudioBackend
from dlr_runtime.backends.onnx import OnnxBackend


def decode_counts(cfg: DLRConfig, batch: int) -> tuple[float, float]:
    h, n, layers, v = cfg.d_model, cfg.d_state, cfg.n_layers, cfg.out_dim
    flops = batch * (layers * (14 * h * n + 4 * h * h + 20 * h) + 2 * h * v + 8 * h)
    weights = layers * (3 * 8 * h * n + 4 * (2 * h * h + 2 * h) + 4 * 3 * h) + 4 * (v * h + v)
    state = batch * 2 * 8 * layers * h * n
    return float(flops), float(weights + state + batch * 4 * (h + v))


def chunk_counts(cfg: DLRConfig, batch: int, samples: int) -> tuple[float, float]:
    h, n, layers, c, s = cfg.d_model, cfg.d_state, cfg.n_layers, cfg.out_dim, cfg.frame_stride
    f = samples // s
    per_layer = f * (2 * h * f + 8 * n * h + 4 * h * h + 20 * h) + 20 * h * n
    flops = batch * (f * 2 * s * h + layers * per_layer + f * (2 * h * c + 12 * h))
    weights = 4 * s * h + layers * (3 * 8 * h * n + 4 * (2 * h * h + 2 * h) + 4 * (h * f * f))
    weights += layers * 4 * 2 * (2 * n * f) + 4 * c * h
    traffic = batch * (2 * 8 * layers * h * n + 4 * samples + 4 * f * c + layers * 8 * h * f * 4)
    return float(flops), float(weights + traffic)


def peaks(quick: bool) -> tuple[float, float]:
    m = 1024 if quick else 2048
    a, b = torch.randn(m, m), torch.randn(m, m)
    t, _ = time_calls(lambda: a @ b, 0.5, min_calls=3)
    flops = 2 * m**3 / t
    big = torch.empty(32 * 2**20 if quick else 64 * 2**20)  # 128 / 256 MB of float32
    dst = torch.empty_like(big)
    t, _ = time_calls(lambda: dst.copy_(big), 0.5, min_calls=3)
    return flops, 2 * big.numel() * 4 / t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--results", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(machine())
    pf, pb = peaks(args.quick)
    print(f"peaks: matmul {pf / 1e9:.1f} GFLOP/s, copy {pb / 1e9:.1f} GB/s")
    lm_cfg = DLRConfig.preset("decode-lm")
    lm = to_recurrent(DLRModel(lm_cfg, seed=0))
    au_cfg = DLRConfig.preset("roofline-speech")
    au = to_recurrent(DLRModel(au_cfg, seed=0))
    tmp = tempfile.mkdtemp(prefix="bench-roof-")
    lm_onnx = OnnxBackend.from_recurrent(lm, f"{tmp}/lm", max_chunk=4, threads=args.threads)
    au_onnx = OnnxBackend.from_recurrent(au, f"{tmp}/au", max_chunk=16, threads=args.threads)
    cases = []
    lm_fused = FusedBackend(lm) if fused_supported(lm) is None else None
    for b in (1, 64, 256):
        tok = torch.randint(0, 258, (b,))
        st = lm.init_state(b)
        ost = lm_onnx.from_torch_state(st)
        fl, by = decode_counts(lm_cfg, b)
        cases.append((f"decode B={b}", "torch", fl, by, lambda t=tok, s=st: lm.step(t, s)))
        cases.append((f"decode B={b}", "onnx", fl, by, lambda t=tok, s=ost: lm_onnx.step(t, s)))
        if lm_fused is not None:
            fst = lm_fused.from_canonical(st)
            cases.append(
                (f"decode B={b}", "fused", fl, by, lambda t=tok, s=fst: lm_fused.step(t, s))
            )
    b, samples = 64, 1600
    x = 0.1 * torch.randn(b, samples)
    st = au.init_state(b)
    ost = au_onnx.from_torch_state(st)
    fl, by = chunk_counts(au_cfg, b, samples)
    cases.append(("audio chunk 64x100ms", "torch", fl, by, lambda: au.chunk(x, st)))
    cases.append(("audio chunk 64x100ms", "onnx", fl, by, lambda: au_onnx.chunk(x, ost)))
    if fused_block.AVAILABLE:
        au_fused = FusedAudioBackend(au)
        cases.append(("audio chunk 64x100ms", "fused", fl, by, lambda: au_fused.chunk(x, st)))
    rows, points = [], []
    for name, way, fl, by, fn in cases:
        t, _ = time_calls(fn, 0.3 if args.quick else 1.0)
        inten = fl / by
        attain = min(pf, inten * pb)
        bound = "memory" if inten * pb < pf else "compute"
        rows.append(
            [name, way, fl / 1e6, by / 1e6, inten, t * 1e6, fl / t / 1e9, by / t / 1e9,
             bound, fl / t / attain]
        )  # fmt: skip
        points.append((f"{name} {way}", inten, fl / t))
    headers = [
        "call", "backend", "MFLOP", "MB", "FLOP/byte", "us/call", "GFLOP/s", "GB/s",
        "roof bound", "fraction of roof",
    ]  # fmt: skip
    table = md_table(headers, rows)
    print(table)
    plot(points, pf, pb, PLOTS / "roofline.png")
    note = (
        f"Measured peaks (same run, {args.threads} thread): matmul {pf / 1e9:.1f} GFLOP/s, "
        f"copy {pb / 1e9:.1f} GB/s (ridge at {pf / pb:.1f} FLOP/byte). Decode: LM H=256, N=64, "
        f"4 layers, V=258; audio: H=64, N=64, 4 layers, stride 160, 64 streams x 1600 samples. "
        f"FLOP and byte counts: formulas in the script's docstring. Plot: "
        f"benchmarks/plots/roofline.png"
    )
    append_results(
        args.results, "Roofline of the decode step and the audio chunk", note + "\n\n" + table
    )


def plot(points, pf: float, pb: float, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [2.0**k for k in range(-4, 9)]
    ax.plot(xs, [min(pf, x * pb) / 1e9 for x in xs], "k-", lw=1.5, label="measured roof")
    for name, inten, achieved in points:
        ax.plot([inten], [achieved / 1e9], "o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="FLOP / byte", ylabel="GFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
