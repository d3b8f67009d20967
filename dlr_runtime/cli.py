"""`dlr-convert CKPT OUT`: write the recurrent form of a checkpoint and check it.

The converted checkpoint stores per layer lambda (as log lambda), B, C in complex128 and D,
so it can be loaded later with either state dtype. The command verifies the conversion by
running both forms on a random input and prints the largest difference.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .model import DLRModel
from .recurrent import to_recurrent


def _probe_input(model: DLRModel, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    cfg = model.config
    if cfg.encoder == "tokens":
        return torch.randint(0, cfg.vocab_size, (1, length), generator=g)
    return 0.1 * torch.randn(1, length * cfg.frame_stride, generator=g, dtype=torch.float64)


def convert_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlr-convert", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="training checkpoint directory")
    parser.add_argument("out", help="output directory for the recurrent checkpoint")
    parser.add_argument("--check-length", type=int, default=256, help="positions of the self-check")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        model = load_checkpoint(args.checkpoint)
    except CheckpointError as e:
        print(f"dlr-convert: {e}", file=sys.stderr)
        return 2
    if not isinstance(model, DLRModel):
        print(f"dlr-convert: {args.checkpoint} is already in recurrent form", file=sys.stderr)
        return 2
    cfg = model.config
    rec = to_recurrent(model.double(), dtype=torch.complex128)
    x = _probe_input(model, args.check_length)
    with torch.no_grad():
        conv = model(x)
    chunk, _ = rec.chunk(x, rec.init_state(1))
    err = float((conv - chunk).abs().max() / conv.abs().max())
    meta = dict(getattr(model, "checkpoint_metadata", {}))
    meta["converted_from"] = str(args.checkpoint)
    save_checkpoint(rec, args.out, **meta)
    state64 = to_recurrent(model.float(), dtype=torch.complex64).state_bytes_per_session()
    print(
        f"read   {args.checkpoint}: {cfg.layer} layers={cfg.n_layers} H={cfg.d_model} N={cfg.d_state}"
    )
    print(
        f"lambda {'shared [N]' if cfg.shared_lambda else 'per feature [H, N]'} -> [H, N] per layer"
    )
    print(
        f"state  {state64:,} bytes/session (complex64), {rec.state_bytes_per_session():,} (complex128)"
    )
    print(f"check  max |conv - chunk| / max |conv| = {err:.2e} over {args.check_length} positions")
    print(f"wrote  {args.out} ({time.perf_counter() - t0:.1f} s)")
    return 0 if err < 1e-8 else 1


if __name__ == "__main__":
    raise SystemExit(convert_main())
