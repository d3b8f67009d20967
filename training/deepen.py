"""Deepen a trained model with identity blocks, so a fine-tune of a larger network starts where
the trained one is.

A block maps its residual stream h to h + out(gelu(ssm(norm(h)))), gated by a GLU where the
config has one. A new block whose output projection gives zero, the GLU's value half of ``out``
(rows 0..H-1 of its weight and bias; all of ``out`` without a GLU), adds nothing: the deeper
network computes exactly what the trained one did (float64 to rounding, streamed too). Its
diagonal layer, norm and gate start at a fresh initialisation (``seed``), and the zero rows get
gradient from the first step, so a fine-tune (`dlr-train kws --n-layers N --init-from DIR`) grows
the new blocks from zero while the old ones keep their weights.

New blocks go between the old ones, spread evenly (4 -> 6: after blocks 2 and 4; 4 -> 8: after
every block), so each new block sees a stream the trained blocks shaped.

    python -m training.deepen models/speech-commands --n-layers 6 --out runs/shipped_deep6

The output is a training checkpoint directory with the input's metadata (its operating point
included: the deeper model scores exactly as the input does) plus "deepened_from".
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from dlr_runtime import DLRModel
from training.rewrite_checkpoint import rewrite

KEY = "deepened_from"  # the metadata key naming the input checkpoint


def new_positions(old: int, new: int) -> list[int]:
    """Indices, in the deeper stack of `new` blocks, of the `new - old` identity blocks: the
    k-th goes after the first floor((k + 1) old / (new - old)) old blocks (4 -> 6: [2, 5];
    4 -> 8: [1, 3, 5, 7]; with more new blocks than old, some go before the first)."""
    if old < 1 or new < old:
        raise ValueError(f"deepen needs 1 <= old <= new layers, got {old} -> {new}")
    extra = new - old
    after = [((k + 1) * old) // extra for k in range(extra)] if extra else []  # old blocks before
    return sorted(a + k for k, a in enumerate(after))


def zero_output(block: torch.nn.Module, glu: bool) -> None:
    """Make `block` add nothing to its residual stream (its GLU's value half at zero)."""
    out = block.pw.out
    h = out.weight.shape[1]
    with torch.no_grad():
        rows = slice(0, h) if glu else slice(None)
        out.weight[rows] = 0.0
        out.bias[rows] = 0.0


def deepen(model: DLRModel, n_layers: int, seed: int = 0) -> DLRModel:
    """A copy of training-form `model` with `n_layers` blocks and the same outputs."""
    cfg = model.config
    deep = DLRModel(replace(cfg, n_layers=n_layers), seed=seed)
    deep = deep.to(next(model.parameters()).dtype)
    fresh = set(new_positions(cfg.n_layers, n_layers))
    old = iter(model.blocks)
    with torch.no_grad():
        for i, block in enumerate(deep.blocks):
            if i in fresh:
                zero_output(block, cfg.glu)
            else:
                block.load_state_dict(next(old).state_dict())
        deep.encoder.load_state_dict(model.encoder.state_dict())
        deep.head.load_state_dict(model.head.state_dict())
    return deep.train(model.training)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.deepen",
        description="Deepen a training checkpoint with identity blocks (the same outputs; the "
        "new blocks' output projections start at zero).",
    )
    ap.add_argument("checkpoint", help="a training-form checkpoint directory")
    ap.add_argument("--n-layers", type=int, required=True, help="blocks of the deeper model")
    ap.add_argument("--seed", type=int, default=0, help="initialisation of the new blocks")
    ap.add_argument("--out", required=True, help="directory to write the deeper checkpoint to")
    args = ap.parse_args(argv)
    try:
        model, _ = rewrite(
            args.checkpoint, args.out, lambda m: deepen(m, args.n_layers, args.seed), KEY
        )
    except ValueError as e:  # (CheckpointError is one)
        ap.exit(2, f"error: {e}\n")
    added = new_positions(model.config.n_layers, args.n_layers)
    print(f"wrote {args.out}: {args.n_layers} blocks, identity blocks at {added}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
