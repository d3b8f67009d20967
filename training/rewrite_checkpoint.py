"""Rewrite a training checkpoint through a function-preserving change of its network.

`training.widen_frontend` and `training.deepen` read a training-form checkpoint, change the
network so that it computes what it did, and write it with the input's metadata (its operating
point included) plus one key that names the input.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dlr_runtime import DLRModel, load_checkpoint, read_header, save_checkpoint


def rewrite(
    checkpoint: str | Path, out: str | Path, change: Callable[[DLRModel], DLRModel], key: str
) -> tuple[DLRModel, DLRModel]:
    """Apply `change` to the training-form model at `checkpoint` and save the result to `out`,
    with the input's metadata and ``key`` = the input's path; returns (input, output) models.

    Raises ValueError (a CheckpointError is one) for a missing or non-training checkpoint and for
    whatever `change` refuses."""
    header = read_header(checkpoint)
    if header["form"] != "train":
        raise ValueError(f"{checkpoint} is a {header['form']}-form checkpoint, not train")
    model = load_checkpoint(checkpoint)
    assert isinstance(model, DLRModel)
    changed = change(model)
    metadata = dict(header.get("metadata") or {})
    metadata[key] = str(Path(checkpoint))
    save_checkpoint(changed, out, **metadata)
    return model, changed
