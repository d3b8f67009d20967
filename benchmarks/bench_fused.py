"""The fused decode step against the torch step, with the shipped byte LM (models/byte-lm).

Per batch size (1, 16, 64): median seconds per decode step of each backend ("torch" =
`RecurrentModel.step`, "fused" = `backends.fused`, "onnx" = ONNX Runtime), measured in
alternating rounds in one process (best round kept), the speed-up over torch, and the distance
to the memory roofline: a step must read and write every session's state once (plus the
weights once), so its floor is bytes / copy bandwidth, with the bandwidth measured in the same
run as a clone of a tensor the size of the batch-64 state (read + write).

    nice -n 10 .venv/bin/python -m benchmarks.bench_fused [--rounds 3] [--no-onnx]
        [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from benchmarks.harness import ROOT, append_results, machine, md_table, time_calls
from dlr_runtime import load_recurrent
from dlr_runtime.backends.fused import FusedBackend

BATCHES = (1, 16, 64)


def copy_bandwidth(nbytes: int, budget: float) -> float:
    """Bytes/s of a clone (read + write) of an `nbytes` float32 tensor."""
    a = torch.randn(nbytes // 4)
    sec, _ = time_calls(a.clone, budget, max_calls=200)
    return 2 * nbytes / sec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "byte-lm"))
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (best kept)")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds per point per round")
    ap.add_argument("--no-onnx", action="store_true")
    ap.add_argument("--results", default=None, help="append a section to this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rec = load_recurrent(args.model)
    cfg = rec.config
    backends = {"torch": rec, "fused": FusedBackend(rec)}
    if not args.no_onnx:
        from dlr_runtime.backends.onnx import OnnxBackend  # noqa: PLC0415

        backends["onnx"] = OnnxBackend.from_recurrent(
            rec, tempfile.mkdtemp(prefix="bench-fused-"), max_chunk=8, threads=1
        )
    print(machine())
    states = {}
    for b in BATCHES:
        st = rec.init_state(b)
        st["ssm"] = torch.randn_like(st["ssm"]) * 0.1  # any context leaves a state of this shape
        states[b] = {n: be.from_canonical(st) for n, be in backends.items()}
    best: dict[tuple[str, int], float] = {}
    bw = 0.0
    for r in range(args.rounds):
        for b in BATCHES:
            tok = torch.randint(0, cfg.vocab_size, (b,))
            for name, be in backends.items():
                s = states[b][name]
                sec, _ = time_calls(lambda be=be, t=tok, s=s: be.step(t, s), args.budget)
                best[(name, b)] = min(best.get((name, b), float("inf")), sec)
        bw = max(bw, copy_bandwidth(max(BATCHES) * rec.state_bytes(), args.budget))
        print(
            f"round {r + 1}: "
            + ", ".join(f"{k[0]}@{k[1]} {v * 1e6:.0f} us" for k, v in best.items())
        )
    weight_bytes = sum(t.numel() * t.element_size() for t in rec.state_dict().values())
    rows = []
    for b in BATCHES:
        floor = (2 * b * rec.state_bytes() + weight_bytes) / bw
        row = [b]
        for name in backends:
            row += [best[(name, b)] * 1e6]
        row += [best[("torch", b)] / best[("fused", b)], floor * 1e6, best[("fused", b)] / floor]
        row += [b / best[("fused", b)]]
        rows.append(row)
    headers = ["batch"] + [f"{n} us/step" for n in backends]
    headers += ["fused / torch speed-up", "roofline us", "fused / roofline", "fused tok/s"]
    table = md_table(headers, rows)
    print(table)
    note = (
        f"Model: {args.model} (H={cfg.d_model}, N={cfg.d_state}, {cfg.n_layers} layers, "
        f"V={cfg.vocab_size}), complex64 state, {rec.state_bytes():,} B/session. Copy bandwidth "
        f"(same run) {bw / 1e9:.2f} GB/s; roofline = (2 x batch x state bytes + weight bytes) / "
        f"bandwidth. Best of {args.rounds} alternating rounds, median per round."
    )
    append_results(args.results, "Fused decode step vs torch step (byte LM)", note + "\n\n" + table)


if __name__ == "__main__":
    main()
