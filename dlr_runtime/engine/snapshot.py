"""One slot's state as bytes: versioned, integrity-checked, tied to its model.

Layout (all integers little-endian):

    magic   b"DLRSTATE"                      8 bytes
    version uint32 (SNAPSHOT_VERSION)         4 bytes
    hlen    uint32                            4 bytes
    header  JSON, hlen bytes: {"model", "config_hash", "tensors": [{"name", "dtype", "shape",
            "offset", "nbytes"}], "extra": {...}}
    payload raw tensor bytes (row-major, CPU), at the offsets of the header
    digest  sha256 of everything above        32 bytes

`config_hash` covers the model config and the state dtype, so a blob only restores into a pool
of a model with the same architecture and weights layout. `extra` carries caller data (e.g. the
server's session bookkeeping). Every problem raises `SnapshotError` with a clear message.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import torch

MAGIC = b"DLRSTATE"
SNAPSHOT_VERSION = 1
_DIGEST = 32
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.int64,
        torch.int32,
        torch.float16,
        torch.bfloat16,
    )
}


class SnapshotError(ValueError):
    """A state blob is malformed, tampered with, or belongs to another model."""


def config_hash(config: Any, state: dict[str, torch.Tensor], weights_hash: str = "") -> str:
    """Hash of the model config plus each state tensor's dtype and per-row shape (plus a
    digest of the weights, when the caller has one)."""
    layout = {k: [str(v.dtype), list(v.shape[1:])] for k, v in sorted(state.items())}
    text = config.to_json() + json.dumps(layout, sort_keys=True) + weights_hash
    return hashlib.sha256(text.encode()).hexdigest()


def pack(model: str, chash: str, row: dict[str, torch.Tensor], extra: dict | None = None) -> bytes:
    """Serialise one slot's state `row` (tensors without the batch axis)."""
    tensors, chunks, offset = [], [], 0
    for name in sorted(row):
        t = row[name].detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        tensors.append(
            {
                "name": name,
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "offset": offset,
                "nbytes": len(raw),
            }
        )
        chunks.append(raw)
        offset += len(raw)
    header = json.dumps(
        {"model": model, "config_hash": chash, "tensors": tensors, "extra": extra or {}},
        sort_keys=True,
    ).encode()
    body = MAGIC + struct.pack("<II", SNAPSHOT_VERSION, len(header)) + header + b"".join(chunks)
    return body + hashlib.sha256(body).digest()


def read_header(blob: bytes) -> dict[str, Any]:
    """Check a blob's framing and digest; return its header (without reading tensors)."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise SnapshotError(f"a state snapshot must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < len(MAGIC) + 8 + _DIGEST or not blob.startswith(MAGIC):
        raise SnapshotError("not a dlr state snapshot (bad magic or too short)")
    version, hlen = struct.unpack_from("<II", blob, len(MAGIC))
    if version != SNAPSHOT_VERSION:
        raise SnapshotError(
            f"state snapshot version {version} is not supported (this runtime reads {SNAPSHOT_VERSION})"
        )
    body, digest = blob[:-_DIGEST], blob[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotError("state snapshot is corrupted or was modified (sha256 mismatch)")
    start = len(MAGIC) + 8
    if start + hlen > len(body):
        raise SnapshotError("state snapshot header length exceeds the blob")
    try:
        header = json.loads(body[start : start + hlen])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SnapshotError(f"state snapshot header is not valid JSON: {e}") from e
    if not isinstance(header, dict) or not {"model", "config_hash", "tensors"} <= set(header):
        raise SnapshotError("state snapshot header lacks model, config_hash or tensors")
    header["_payload"] = start + hlen
    return header


def unpack(
    blob: bytes, model: str, chash: str, like: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict]:
    """Parse and check a blob against the model name, config hash and row layout `like`.

    Returns (row tensors on CPU, extra).
    """
    header = read_header(blob)
    if header["model"] != model:
        raise SnapshotError(f"state snapshot is for model {header['model']!r}, not {model!r}")
    if header["config_hash"] != chash:
        raise SnapshotError(
            f"state snapshot of model {model!r} was made with a different config or state dtype"
        )
    blob = bytes(blob)
    payload, end = header["_payload"], len(blob) - _DIGEST
    out: dict[str, torch.Tensor] = {}
    for spec in header["tensors"]:
        name = spec.get("name")
        if name not in like:
            raise SnapshotError(f"state snapshot has unknown tensor {name!r}")
        ref = like[name]
        dtype = _DTYPES.get(spec.get("dtype"))
        if dtype != ref.dtype or list(spec.get("shape", [])) != list(ref.shape):
            raise SnapshotError(
                f"state snapshot tensor {name!r} is {spec.get('dtype')} {spec.get('shape')}, "
                f"expected {ref.dtype} {list(ref.shape)}"
            )
        lo = payload + int(spec["offset"])
        hi = lo + int(spec["nbytes"])
        if hi > end or int(spec["nbytes"]) != ref.numel() * ref.element_size():
            raise SnapshotError(f"state snapshot tensor {name!r} has a wrong byte range")
        raw = bytearray(blob[lo:hi])
        out[name] = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(ref.shape)
    missing = sorted(set(like) - set(out))
    if missing:
        raise SnapshotError(f"state snapshot lacks tensors {missing}")
    extra = header.get("extra", {})
    return out, extra if isinstance(extra, dict) else {}
