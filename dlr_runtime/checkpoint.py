"""Checkpoints: a directory with `model.safetensors` (tensors) and `config.json` (everything else).

config.json = {"format": "dlr-checkpoint", "format_version": 1, "form": "train" | "recurrent",
               "config": DLRConfig, "metadata": {...}, "tensors": {"bytes", "sha256"}}

`form` says which tensors are stored: a trained `DLRModel`'s parameters, or the recurrent form
(per layer log_lam, B, C as float64 real/imaginary pairs, D, plus the position-wise parts).
No pickle anywhere. Every failure to load raises `CheckpointError` naming the path and the
problem (missing, truncated, corrupted, wrong version, mismatched shapes).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import DLRConfig
from .model import DLRModel
from .recurrent import RecurrentModel, to_recurrent
from .ssm import RecurrentParams

FORMAT = "dlr-checkpoint"
FORMAT_VERSION = 1
TENSORS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class CheckpointError(ValueError):
    """A checkpoint could not be read; the message names the file and the problem."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def recurrent_tensors(model: RecurrentModel) -> dict[str, torch.Tensor]:
    """The recurrent form as real tensors: complex ones stored as (..., 2) float64 pairs."""
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if name == "lam":  # derived from log_lam at load time
            continue
        if t.is_complex():
            t = torch.view_as_real(t.to(torch.complex128))
        out[name] = t.detach().cpu().contiguous()
    shared = [i for i, s in enumerate(model.shared) if s]
    if shared:
        out["shared_layers"] = torch.tensor(shared, dtype=torch.int64)
    return out


def save_checkpoint(model: DLRModel | RecurrentModel, path: str | Path, **metadata: Any) -> Path:
    """Write `model` (training or recurrent form) to directory `path`; returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if isinstance(model, RecurrentModel):
        form, tensors = "recurrent", recurrent_tensors(model)
    elif isinstance(model, DLRModel):
        form = "train"
        tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    else:
        raise TypeError(f"save_checkpoint expects a DLRModel or RecurrentModel, got {type(model)}")
    tensor_path = path / TENSORS_FILE
    tmp = path / (TENSORS_FILE + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, tensor_path)
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "form": form,
        "config": model.config.to_dict(),
        "metadata": metadata,
        "tensors": {"bytes": tensor_path.stat().st_size, "sha256": _sha256(tensor_path)},
    }
    _atomic_write_text(path / CONFIG_FILE, json.dumps(header, indent=2, sort_keys=True))
    return path


def read_header(path: str | Path) -> dict[str, Any]:
    """Read and check config.json of checkpoint directory `path`."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} is not a directory (expected {CONFIG_FILE} + {TENSORS_FILE})"
        )
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no {CONFIG_FILE}")
    try:
        header = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{cfg_path} is not a {FORMAT} header")
    version = header.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{cfg_path} has format_version {version!r}; this runtime reads version {FORMAT_VERSION}"
        )
    if header.get("form") not in ("train", "recurrent"):
        raise CheckpointError(f"{cfg_path} has unknown form {header.get('form')!r}")
    try:
        header["config"] = DLRConfig.from_dict(header["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{cfg_path} has an invalid model config: {e}") from e
    return header


def _read_tensors(path: Path, header: dict[str, Any]) -> dict[str, torch.Tensor]:
    tensor_path = path / TENSORS_FILE
    if not tensor_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no {TENSORS_FILE}")
    expect = header.get("tensors", {})
    size = tensor_path.stat().st_size
    if "bytes" in expect and size != expect["bytes"]:
        kind = "truncated" if size < expect["bytes"] else "has extra bytes"
        raise CheckpointError(f"{tensor_path} is {kind}: {size} bytes, expected {expect['bytes']}")
    if "sha256" in expect and _sha256(tensor_path) != expect["sha256"]:
        raise CheckpointError(f"{tensor_path} is corrupted: sha256 does not match {CONFIG_FILE}")
    try:
        return load_file(str(tensor_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{tensor_path} could not be parsed as safetensors: {e}") from e


def _load_state(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: Path) -> None:
    own = module.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: tensors do not match the config: missing {missing}, unexpected {unexpected}"
        )
    for name, t in own.items():
        if tuple(t.shape) != tuple(tensors[name].shape):
            raise CheckpointError(
                f"{where}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                f"the config needs {tuple(t.shape)}"
            )
    module.load_state_dict(tensors)


def load_checkpoint(path: str | Path) -> DLRModel | RecurrentModel:
    """Load a checkpoint in the form it was saved; `.checkpoint_metadata` holds its metadata."""
    path = Path(path)
    header = read_header(path)
    tensors = _read_tensors(path, header)
    cfg: DLRConfig = header["config"]
    if header["form"] == "train":
        model: DLRModel | RecurrentModel = DLRModel(cfg)
        _load_state(model, tensors, path / TENSORS_FILE)
        model.eval()
    else:
        model = _recurrent_from_tensors(cfg, tensors, path / TENSORS_FILE, torch.complex128)
    model.checkpoint_metadata = header["metadata"]
    return model


def _recurrent_from_tensors(
    cfg: DLRConfig, tensors: dict[str, torch.Tensor], where: Path, dtype: torch.dtype
) -> RecurrentModel:
    tensors = dict(tensors)
    shared_layers = set(tensors.pop("shared_layers", torch.zeros(0, dtype=torch.int64)).tolist())
    skeleton = DLRModel(cfg)
    h, n = cfg.d_model, cfg.d_state
    try:
        params = []
        for i in range(cfg.n_layers):
            log_lam = torch.view_as_complex(tensors["log_lam"][i].contiguous())
            params.append(
                RecurrentParams(
                    log_lam=log_lam[0] if i in shared_layers else log_lam,
                    B=torch.view_as_complex(tensors["B"][i].contiguous()),
                    C=torch.view_as_complex(tensors["C"][i].contiguous()),
                    D=tensors["D"][i].double(),
                )
            )
    except (KeyError, IndexError, RuntimeError) as e:
        raise CheckpointError(f"{where}: recurrent tensors are missing or malformed: {e}") from e
    for name in ("log_lam", "B", "C"):
        if tuple(tensors[name].shape) != (cfg.n_layers, h, n, 2):
            raise CheckpointError(
                f"{where}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                f"the config needs {(cfg.n_layers, h, n, 2)}"
            )
    rec = RecurrentModel(
        cfg, skeleton.encoder, [b.pw for b in skeleton.blocks], skeleton.head, params, dtype=dtype
    )
    ssm_keys = ("log_lam", "lam", "B", "C", "D")
    own = {k: v for k, v in tensors.items() if k not in ssm_keys}
    module_state = {k: v for k, v in rec.state_dict().items() if k not in ssm_keys}
    unexpected = sorted(set(own) - set(module_state))
    if unexpected:
        raise CheckpointError(f"{where}: unexpected tensors {unexpected}")
    for k, v in module_state.items():
        if k not in own:
            raise CheckpointError(f"{where}: tensor {k!r} is missing")
        if tuple(own[k].shape) != tuple(v.shape):
            raise CheckpointError(
                f"{where}: tensor {k!r} has shape {tuple(own[k].shape)}, the config needs {tuple(v.shape)}"
            )
    rec.load_state_dict({k: v.to(module_state[k].dtype) for k, v in own.items()}, strict=False)
    return rec


def load_recurrent(
    path: str | Path,
    dtype: torch.dtype = torch.complex64,
    device: torch.device | str = "cpu",
    max_block: int = 256,
) -> RecurrentModel:
    """Load any checkpoint as a `RecurrentModel` on `device` (converting a training checkpoint)."""
    path = Path(path)
    header = read_header(path)
    tensors = _read_tensors(path, header)
    cfg: DLRConfig = header["config"]
    if header["form"] == "train":
        model = DLRModel(cfg)
        _load_state(model, tensors, path / TENSORS_FILE)
        rec = to_recurrent(model, dtype=dtype, max_block=max_block)
    else:
        rec = _recurrent_from_tensors(cfg, tensors, path / TENSORS_FILE, dtype)
        rec.max_block = max_block
    rec.checkpoint_metadata = header["metadata"]
    return rec.to(device)
