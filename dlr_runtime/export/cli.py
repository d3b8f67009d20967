"""The `dlr-export` command: a checkpoint -> ONNX graphs, or -> a Triton model repository.

    dlr-export onnx   CKPT OUT [--dtype complex64|complex128] [--max-chunk 64]
    dlr-export triton CKPT OUT [--name NAME] [--max-batch-size 256] [--idle-seconds 60]

`onnx` writes the directory `OnnxBackend` loads (step, chunk and scores graphs + manifest);
`triton` writes a model repository (step graph with sequence controls, config.pbtxt, README).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..checkpoint import CheckpointError, load_recurrent

DTYPES = {"complex64": torch.complex64, "complex128": torch.complex128}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlr-export", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="target", required=True)
    o = sub.add_parser("onnx", help="ONNX step/chunk graphs for the onnx backend")
    o.add_argument("checkpoint", type=Path, help="checkpoint directory")
    o.add_argument("out", type=Path, help="output directory")
    o.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="complex64",
        help="state dtype of the model; the graphs use the matching float (default complex64)",
    )
    o.add_argument(
        "--max-chunk", type=int, default=64, help="largest T of one chunk graph call (default 64)"
    )
    t = sub.add_parser("triton", help="Triton Inference Server model repository")
    t.add_argument("checkpoint", type=Path, help="checkpoint directory")
    t.add_argument("out", type=Path, help="model repository directory")
    t.add_argument("--name", default=None, help="model name (default: the checkpoint's name)")
    t.add_argument("--max-batch-size", type=int, default=256, help="default 256")
    t.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        help="release a sequence idle this long (default 60)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dtype = DTYPES[getattr(args, "dtype", "complex64")]
    try:
        rec = load_recurrent(args.checkpoint, dtype=dtype, device="cpu")
    except (CheckpointError, FileNotFoundError) as e:
        print(f"dlr-export: cannot load checkpoint: {e}", file=sys.stderr)
        return 2
    try:
        if args.target == "onnx":
            from .onnx_export import export_onnx  # noqa: PLC0415  (heavy import, on demand)

            out = export_onnx(rec, args.out, max_chunk=args.max_chunk)
            print(f"wrote ONNX graphs to {out}")
        else:
            from .triton import export_triton  # noqa: PLC0415

            name = args.name or args.checkpoint.resolve().name
            out = export_triton(
                rec,
                args.out,
                name=name,
                max_batch_size=args.max_batch_size,
                idle_us=int(args.idle_seconds * 1e6),
            )
            print(f"wrote Triton model {out} (see {args.out / 'README.md'})")
    except ValueError as e:
        print(f"dlr-export: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
