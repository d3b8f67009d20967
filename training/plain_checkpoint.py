"""Checkpoints of models that are not a `DLRModel` (baselines, synthetic-suite models).

Same layout as dlr_runtime's checkpoints (a directory with model.safetensors and config.json,
no pickle), with format "dlr-train-plain": the JSON names the architecture, its config and the
training summary. dlr_runtime does not load these; `load_plain_state` restores the weights into
a model built from the stored config.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from torch import nn

FORMAT = "dlr-train-plain"


def save_plain(
    model: nn.Module, path: str | Path, arch: str, config: dict, **metadata: Any
) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tmp = path / "model.safetensors.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, path / "model.safetensors")
    header = {"format": FORMAT, "arch": arch, "config": config, "metadata": metadata}
    fd, tmp_json = tempfile.mkstemp(dir=path, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(header, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp_json, path / "config.json")
    return path


def read_plain_header(path: str | Path) -> dict[str, Any]:
    header = json.loads((Path(path) / "config.json").read_text())
    if header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} checkpoint")
    return header


def load_plain_state(model: nn.Module, path: str | Path) -> nn.Module:
    model.load_state_dict(load_file(Path(path) / "model.safetensors"))
    return model
