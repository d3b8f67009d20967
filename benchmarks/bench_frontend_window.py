"""What overlapping front-end windows cost a speech stream: the shipped speech model's weights
with each 20 ms frame's log-mel taken over the frame alone (as shipped) or over a 40 ms Hann
window ending with it (`DLRConfig.frame_window=640`; the state keeps the 320 samples before the
frame).

Per batch of streams (1, 16, 64): median seconds per 100 ms chunk (5 frames, the server's
piece) through the engine's speech backend for each front end, measured in alternating rounds
in one process (best round kept), the ratio window / frame, the front end alone (log-mel of
the chunk's frames), and the state bytes per session.

    nice -n 10 .venv/bin/python -m benchmarks.bench_frontend_window [--backend fused|torch]
        [--rounds 3] [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from benchmarks.harness import ROOT, append_results, machine, md_table, time_calls
from dlr_runtime import DLRModel, load_checkpoint, to_recurrent
from dlr_runtime.backends import Backend, make_backend
from dlr_runtime.model import frames_of
from dlr_runtime.recurrent import RecurrentModel

BATCHES = (1, 16, 64)
CHUNK = 1600  # samples: 100 ms at 16 kHz


def backends(model_dir: str, kind: str) -> dict[str, tuple[RecurrentModel, Backend]]:
    """The same weights behind both front ends: name -> (recurrent form, the engine's backend)."""
    base = load_checkpoint(model_dir).eval()
    out = {}
    for name, window in (("frame", 0), ("window", 2 * base.config.frame_stride)):
        m = DLRModel(replace(base.config, frame_window=window))
        m.load_state_dict(base.state_dict())
        rec = to_recurrent(m.eval())
        out[name] = (rec, make_backend(rec, kind))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "speech-commands"))
    ap.add_argument("--backend", default="fused", choices=["fused", "torch"])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (best kept)")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds per point per round")
    ap.add_argument("--results", default=None, help="append a section to this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bes = backends(args.model, args.backend)
    g = torch.Generator().manual_seed(0)
    rows = []
    for b in BATCHES:
        x = 0.1 * torch.randn(b, CHUNK, generator=g)
        best: dict[str, float] = {}
        fe_best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, (rec, be) in bes.items():
                state = be.init_state(b)
                sec, _ = time_calls(lambda be=be, s=state, x=x: be.chunk(x, s), args.budget)
                best[name] = min(best.get(name, float("inf")), sec)
                cfg = rec.config
                frames = frames_of(x, cfg.frame_stride, cfg.history)
                fe = rec.encoder.frontend
                sec, _ = time_calls(lambda fe=fe, f=frames: fe(f), args.budget)
                fe_best[name] = min(fe_best.get(name, float("inf")), sec)
        rows.append(
            [b, 1e3 * best["frame"], 1e3 * best["window"], best["window"] / best["frame"],
             1e3 * fe_best["frame"], 1e3 * fe_best["window"]]
        )  # fmt: skip
    state_kb = {n: rec.state_bytes() / 1024 for n, (rec, _) in bes.items()}
    body = (
        f"model `{args.model}` weights, backend `{args.backend}`, 100 ms chunks (5 frames); "
        f"state per session: frame {state_kb['frame']:.1f} KiB, window {state_kb['window']:.1f} "
        f"KiB; {machine()}\n\n"
        + md_table(
            [
                "streams",
                "frame: ms/chunk",
                "window: ms/chunk",
                "window / frame",
                "front end, frame: ms",
                "front end, window: ms",
            ],
            rows,
        )  # fmt: skip
    )
    print(body)
    append_results(
        args.results, "Speech front end: overlapping windows (bench_frontend_window)", body
    )


if __name__ == "__main__":
    main()
