"""Split a classifier's last label into a union of classes without changing what it computes.

For a fine-tune with ``dlr-train kws --unknown-classes`` (each unknown word of the corpus its own
class, ``_unknown_`` their union: `dlr_runtime/unknown_head.py`), the shipped model's one
``_unknown_`` row of the projection becomes K copies, each with its bias lowered by log K, so the
union's score is the row's old logit and every output stays as it was (float64 to rounding).
The fine-tune then starts exactly at the input model, and the fine-tunes and their start average
into one model (`training.soup --with-start` needs equal shapes: the start is this output).

    python -m training.split_unknown models/speech-commands --out runs/shipped_union

K defaults to the number of unknown words of the corpus (`training.data.vocab.unknown_words`),
which is what `--unknown-classes` trains on without `--extra-near-misses`. The output is a
training checkpoint directory with the input's metadata (its operating point included) plus
"split_from".
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from functools import partial

from dlr_runtime import DLRModel
from dlr_runtime.unknown_head import split_last_row
from training.data.vocab import unknown_words
from training.rewrite_checkpoint import rewrite


def split(model: DLRModel, classes: int) -> DLRModel:
    """A copy of classifier `model` whose last label is the union of `classes` classes."""
    cfg = model.config
    if cfg.decoder != "classifier":
        raise ValueError("split needs a classifier")
    if cfg.unknown_classes:
        raise ValueError(f"the model's last label is already a union of {cfg.unknown_classes}")
    if classes < 1:
        raise ValueError(f"--classes must be >= 1, got {classes}")
    out = DLRModel(replace(cfg, unknown_classes=classes)).to(next(model.parameters()).dtype)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    proj = split_last_row(model.head.proj, classes)
    state["head.proj.weight"], state["head.proj.bias"] = proj.weight, proj.bias
    out.load_state_dict(state)
    return out.train(model.training)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.split_unknown",
        description="Split a classifier checkpoint's last label (_unknown_) into a union of "
        "classes with the same outputs.",
    )
    ap.add_argument("checkpoint", help="a training-form checkpoint directory of a classifier")
    ap.add_argument("--out", required=True, help="directory to write the split checkpoint to")
    ap.add_argument(
        "--classes",
        type=int,
        default=len(unknown_words()),
        help="classes in the union (default: the corpus's unknown words, %(default)s)",
    )
    args = ap.parse_args(argv)
    try:
        rewrite(args.checkpoint, args.out, partial(split, classes=args.classes), "split_from")
    except ValueError as e:  # (CheckpointError is one)
        ap.exit(2, f"error: {e}\n")
    print(f"wrote {args.out}: the last label the union of {args.classes} classes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
