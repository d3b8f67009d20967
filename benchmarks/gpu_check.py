"""One-run device check of every backend: parity, graph capture, decode tokens/s, streams.

    python -m benchmarks.gpu_check --device cuda --out gpu_check.md     (what gpu_check.sh runs)
    python -m benchmarks.gpu_check --device cpu --quick --out /tmp/x.md (the CPU-side test)

1. parity: torch (RecurrentModel on the device), torch-fast (CUDA-graph step on CUDA, eager
   real-arithmetic step on CPU) and onnx (CUDA execution provider on CUDA) against a complex128
   CPU reference: LM decode steps + a prefill chunk, and an audio classifier chunk + steps.
2. capture: time to capture the decode-step CUDA graphs for every batch size.
3. decode tokens/s at batch 1..4096 (CPU --quick: 1 and 4) for each backend.
4. streams: concurrent real-time 16 kHz streams per device (100 ms chunks, largest batch
   whose tick fits the time budget), torch and onnx chunk forms.
Writes a markdown report to --out; exits 1 if any parity check fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import machine, md_table
from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends.onnx import OnnxBackend
from dlr_runtime.backends.torch_compiled import FastTorchBackend


def configs(quick: bool) -> tuple[DLRConfig, DLRConfig]:
    """LM (H=256, N=64, 4 layers) and audio classifier (H=64, N=64, 4 layers, stride 160);
    --quick uses tiny ones of the same kinds (the CPU-side test)."""
    if quick:
        return DLRConfig.preset("tiny-lm", init="omega"), DLRConfig.preset("tiny-speech")
    return DLRConfig.preset("decode-lm"), DLRConfig.preset("roofline-speech")


TOL = 2e-3  # float32 backends vs complex128 reference, unit-scale random models


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, dev: torch.device, budget: float, min_calls: int = 3) -> float:
    """Median seconds per call, synchronising the device around each call."""
    fn()
    sync(dev)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or (time.perf_counter() - start < budget and len(times) < 500):
        t = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def backends(rec, dev: torch.device, tmp: str, tag: str) -> dict:
    out = {"torch": rec, "torch-fast": FastTorchBackend(rec, compile_cpu=False)}
    out["onnx"] = OnnxBackend.from_recurrent(rec, f"{tmp}/{tag}", device=dev, max_chunk=16)
    return out


def parity(dev: torch.device, tmp: str, quick: bool) -> tuple[list[list], dict, dict]:
    rows = []
    lm_cfg, au_cfg = configs(quick)
    lm_model, au_model = DLRModel(lm_cfg, seed=0), DLRModel(au_cfg, seed=0)
    ref_lm, ref_au = (
        to_recurrent(lm_model, torch.complex128),
        to_recurrent(au_model, torch.complex128),
    )
    lm_bes = backends(to_recurrent(lm_model).to(dev), dev, tmp, "lm")
    au_bes = backends(to_recurrent(au_model).to(dev), dev, tmp, "au")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 258, (3, 37), generator=gen)
    toks = torch.randint(0, 258, (3, 8), generator=gen)
    y_ref, s_ref = ref_lm.chunk(prompt, ref_lm.init_state(3))
    ys_ref = []
    for t in range(toks.shape[1]):
        y, s_ref = ref_lm.step(toks[:, t], s_ref)
        ys_ref.append(y)
    for name, be in lm_bes.items():
        y, s = be.chunk(prompt.to(dev), be.init_state(3))
        err = (y.cpu().double() - y_ref).abs().max().item()
        for t in range(toks.shape[1]):
            y, s = be.step(toks[:, t].to(dev), s)
            err = max(err, (y.cpu().double() - ys_ref[t]).abs().max().item())
        rows.append(["LM prefill 37 + 8 steps", name, err, "ok" if err < TOL else "FAIL"])
    audio = 0.1 * torch.randn(2, 16000 + 77, generator=gen)
    ya_ref, sa_ref = ref_au.chunk(audio[:, :16000], ref_au.init_state(2))
    for t in range(16000, audio.shape[1]):
        y_last_ref, sa_ref = ref_au.step(audio[:, t], sa_ref)
    for name, be in au_bes.items():
        y, s = be.chunk(audio[:, :16000].to(dev), be.init_state(2))
        err = (y.cpu().double() - ya_ref).abs().max().item()
        for t in range(16000, audio.shape[1]):
            y, s = be.step(audio[:, t].to(dev), s)
        err = max(err, (y.cpu().double() - y_last_ref).abs().max().item())
        rows.append(["audio 1 s chunk + 77 steps", name, err, "ok" if err < TOL else "FAIL"])
    return rows, lm_bes, au_bes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small batches and budgets")
    ap.add_argument("--out", required=True, help="markdown report file")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    t0 = time.time()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else machine()
    report = [f"# Device check on {name}\n"]
    tmp = tempfile.mkdtemp(prefix="gpu-check-")
    rows, lm_bes, au_bes = parity(dev, tmp, args.quick)
    report += [f"## Parity vs complex128 CPU reference (tolerance {TOL:g})\n"]
    report += [md_table(["check", "backend", "max abs err", "result"], rows), ""]
    print(report[-2], flush=True)

    batches = [1, 4] if args.quick else [1, 4, 16, 64, 256, 1024, 4096]
    budget = 0.1 if args.quick else 0.5
    fast: FastTorchBackend = lm_bes["torch-fast"]
    if dev.type == "cuda":
        t = time.perf_counter()
        fast.capture(batches)
        report += [
            f"CUDA graphs captured for batches {batches} in {time.perf_counter() - t:.2f} s\n"
        ]
    dec_rows = []
    for b in batches:
        tok = torch.randint(0, 258, (b,), device=dev)
        row = [b]
        for be in lm_bes.values():
            st = be.init_state(b)
            row.append(b / timed(lambda be=be, st=st, tok=tok: be.step(tok, st), dev, budget))
        dec_rows.append(row)
        print(f"decode batch {b}: " + ", ".join(f"{v:.4g}" for v in row[1:]), flush=True)
    report += ["## Decode tokens/s (aggregate)\n"]
    report += [md_table(["batch", *[f"{k} tok/s" for k in lm_bes]], dec_rows), ""]

    stream_batches = [1, 16] if args.quick else [256, 1024, 4096, 16384]
    st_rows = []
    for b in stream_batches:
        x = 0.1 * torch.randn(b, 1600, device=dev)
        for nm in ("torch", "onnx"):
            be = au_bes[nm]
            st = be.init_state(b)
            t = timed(lambda be=be, st=st, x=x: be.chunk(x, st), dev, budget, min_calls=2)
            st_rows.append([nm, b, t * 1e3, "yes" if t < 0.1 else "no", b * 0.1 / t])
    report += ["## Streams: 100 ms ticks of 16 kHz audio\n"]
    report += [md_table(["backend", "streams", "ms per tick", "real time?", "capacity"], st_rows)]
    report += [f"\nTotal time {time.time() - t0:.0f} s\n"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(report))
    print("\n".join(report[-4:]))
    return 1 if any(r[-1] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
