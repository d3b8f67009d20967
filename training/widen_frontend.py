"""Widen a log-mel speech model to the ``logmel_pcen`` front end without changing what it computes.

The ``logmel_pcen`` front end (`dlr_runtime/pcen.py`) feeds the frame projection each frame's
log-mel features followed by its PCEN features. A ``logmel`` model's projection (H, M) becomes
(H, 2M) with its columns unchanged and zeros for the PCEN half; PCEN's per-band parameters start
at their initial values. The widened network's outputs equal the original's (the log-mel half is
the same function of the same energies; float64 to rounding), so a fine-tune of it
(`dlr-train kws --frontend logmel_pcen --init-from DIR`) starts exactly at the log-mel model, and
the fine-tunes and their start average into one model (`training.soup --with-start`).

    python -m training.widen_frontend models/speech-commands --out runs/shipped_logmel_pcen

The output is a training checkpoint directory with the input's metadata (its operating point
included: the widened model scores exactly as the input does) plus "widened_from".
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from dlr_runtime import DLRModel
from training.rewrite_checkpoint import rewrite

FROM_FRONTEND = "logmel"
TO_FRONTEND = "logmel_pcen"


def widen(model: DLRModel) -> DLRModel:
    """A ``logmel_pcen`` copy of ``logmel`` training-form `model` with the same outputs."""
    cfg = model.config
    if cfg.encoder != "audio" or cfg.frontend != FROM_FRONTEND:
        raise ValueError(
            f"widen needs an audio model with the {FROM_FRONTEND!r} front end, got "
            f"encoder {cfg.encoder!r}, front end {cfg.frontend!r}"
        )
    if cfg.feature_norm_s:
        raise ValueError("widen: a model with feature normalisation has no PCEN form")
    wide = DLRModel(replace(cfg, frontend=TO_FRONTEND)).to(next(model.parameters()).dtype)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    w = state["encoder.frame.weight"]  # (H, M)
    state["encoder.frame.weight"] = torch.cat([w, torch.zeros_like(w)], dim=1)  # (H, 2M)
    for name, value in wide.state_dict().items():
        state.setdefault(name, value)  # PCEN's parameters at their initial values
    wide.load_state_dict(state)
    return wide.train(model.training)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.widen_frontend",
        description="Widen a log-mel speech checkpoint to the logmel_pcen front end "
        "(the same outputs; PCEN's half of the frame projection at zero).",
    )
    ap.add_argument("checkpoint", help="a training-form checkpoint directory of a logmel model")
    ap.add_argument("--out", required=True, help="directory to write the widened checkpoint to")
    args = ap.parse_args(argv)
    try:
        rewrite(args.checkpoint, args.out, widen, "widened_from")
    except ValueError as e:  # (CheckpointError is one)
        ap.exit(2, f"error: {e}\n")
    print(f"wrote {args.out}: {TO_FRONTEND} front end, PCEN half of the frame projection at zero")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
