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

Anyone can recompute a sha256, so the digest only catches accidents. Before anything is
allocated, `read_header` therefore validates every header field against a schema
(`header_schema.py`): standard JSON only (no NaN/Infinity), nesting at most `MAX_DEPTH`, tensor
specs with known dtypes and byte ranges inside the payload, and the stream-position fields of
`extra` typed and in range. `state_bounds` / `check_state` then bound the restored values by
what the model can reach.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from typing import Any

import torch

from ..config import DLRConfig
from ..feature_norm import norm_decay
from ..heads import pool_decay
from ..pcen import pcen_decay
from .header_schema import SnapshotHeaderError, parse_header_json, validate_header

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


class InvalidHeader(SnapshotError):
    """A header field has the wrong type, is out of range, or the JSON is not plain JSON."""


class StateOutOfRange(SnapshotError):
    """A restored state holds values the model cannot reach (non-finite or beyond its bound)."""


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
        header = parse_header_json(body[start : start + hlen])
        validate_header(header, payload_bytes=len(body) - start - hlen)
    except SnapshotHeaderError as e:
        raise InvalidHeader(str(e)) from None
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
        name = spec["name"]
        if name in out:
            raise SnapshotError(f"state snapshot has tensor {name!r} twice")
        if name not in like:
            raise SnapshotError(f"state snapshot has unknown tensor {name!r}")
        ref = like[name]
        dtype = _DTYPES.get(spec["dtype"])
        if dtype != ref.dtype or list(spec["shape"]) != list(ref.shape):
            raise SnapshotError(
                f"state snapshot tensor {name!r} is {spec.get('dtype')} {spec.get('shape')}, "
                f"expected {ref.dtype} {list(ref.shape)}"
            )
        lo = payload + spec["offset"]  # (ints within the payload: checked by read_header)
        hi = lo + spec["nbytes"]
        if hi > end or spec["nbytes"] != ref.numel() * ref.element_size():
            raise SnapshotError(f"state snapshot tensor {name!r} has a wrong byte range")
        raw = bytearray(blob[lo:hi])
        out[name] = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(ref.shape)
    missing = sorted(set(like) - set(out))
    if missing:
        raise SnapshotError(f"state snapshot lacks tensors {missing}")
    extra = header.get("extra", {})
    return out, extra if isinstance(extra, dict) else {}


# ---------------------------------------------------------------------- reachable states
STATE_SAFETY = 4.0  # margin over the derived bound (float rounding, norm eps)
STATE_ABS_CAP = 1e12  # used where no bound can be derived (no pre-norm, |lambda| = 1, ONNX)


def _input_bound(norm: torch.nn.Module, width: int) -> torch.Tensor | None:
    """Bound on |norm(h)| per feature (H,), whatever h: LayerNorm output is at most
    sqrt(H - 1) |gamma| + |beta|, RMSNorm at most sqrt(H) |gamma|; None for no norm."""
    root = math.sqrt(width)
    if isinstance(norm, torch.nn.LayerNorm):
        g = norm.weight if norm.weight is not None else torch.ones(width)
        b = norm.bias if norm.bias is not None else torch.zeros(width)
        return root * g.detach().double().abs() + b.detach().double().abs()
    if isinstance(norm, torch.nn.RMSNorm):
        g = norm.weight if norm.weight is not None else torch.ones(width)
        return root * g.detach().double().abs()
    return None


def state_bounds(rec: Any) -> dict[str, torch.Tensor]:
    """Largest |value| each state tensor of `rec` (a RecurrentModel) can reach, per element.

    A layer's state obeys x_t = lam x_{t-1} + B u_t, so with |u| <= U and |lam| < 1,
    |x_t| <= sum_k |lam|^k |B| U = |B| U / (1 - |lam|). With pre-norm, u = norm(h) is bounded
    whatever h (see `_input_bound`). The classifier's running feature sum is at most
    count x the head norm's bound. Bounds carry a margin `STATE_SAFETY`; where no bound can be
    derived (no pre-norm, |lam| = 1) `STATE_ABS_CAP` applies. Shapes are the per-row shapes.
    """
    cfg = rec.config
    h = cfg.d_model
    out: dict[str, torch.Tensor] = {}
    rows = []
    for i, blk in enumerate(rec.blocks):
        u = _input_bound(blk.norm, h) if cfg.prenorm else None  # (H,) or None
        decay = -torch.expm1(rec.log_lam[i].real.double())  # 1 - |lam|  (H, N)
        b = rec.B[i].to(torch.complex128).abs()  # (H, N)
        if u is None:
            bound = torch.full_like(decay, STATE_ABS_CAP)
        else:
            bound = STATE_SAFETY * b * u[:, None] / decay.clamp(min=1e-300)
            bound = torch.where(decay > 0, bound, torch.full_like(bound, STATE_ABS_CAP))
        rows.append(bound)
    out["ssm"] = torch.stack(rows)  # (L, H, N)
    out.update(config_bounds(cfg))
    if cfg.decoder == "classifier":
        f = _input_bound(rec.head.norm, h) if cfg.prenorm else None
        per = torch.full((h,), STATE_ABS_CAP) if f is None else STATE_SAFETY * f
        out["mean_sum"] = per.double()  # (H,) per counted position
    return out


def config_bounds(cfg: DLRConfig) -> dict[str, torch.Tensor]:
    """What the config alone bounds (any backend): a decayed count c_t = a c_{t-1} + 1 stays
    in [0, 1 / (1 - a)] ("mean_count" of an exponential-window head, "feat_count" of the
    feature normalisation, "pcen_count" of the PCEN smoother); a feature or energy sum stays
    within the generic cap per counted frame."""
    out: dict[str, torch.Tensor] = {}
    if cfg.decoder == "classifier" and pool_decay(cfg) < 1.0:
        out["mean_count"] = torch.tensor(1.0 / (1.0 - pool_decay(cfg)), dtype=torch.float64)
    if cfg.encoder == "audio" and cfg.feature_norm_s:
        out["feat_count"] = torch.tensor(1.0 / (1.0 - norm_decay(cfg)), dtype=torch.float64)
        out["feat_sum"] = torch.full((cfg.feature_dim,), STATE_ABS_CAP, dtype=torch.float64)
    if pcen_decay(cfg):
        out["pcen_count"] = torch.tensor(1.0 / (1.0 - pcen_decay(cfg)), dtype=torch.float64)
        out["pcen_sum"] = torch.full((cfg.n_mels,), STATE_ABS_CAP, dtype=torch.float64)
    return out


def _check_count(
    row: dict[str, torch.Tensor], count: str, total: str, cap: dict[str, torch.Tensor]
) -> None:
    """A running count (an integer, or a decayed weight when `cap` bounds it) and the sum it
    counts (at most `cap[total]` per counted position)."""
    n = float(row[count])
    if count in cap:  # a decayed weight: 0 <= c <= 1 / (1 - a)
        top = float(cap[count]) * (1 + 1e-9)
        if not 0 <= n <= top:
            raise StateOutOfRange(f"state snapshot tensor {count!r} is {n:g}, outside [0, {top:g}]")
    elif n < 0 or n != int(n) or n > 2.0**53:
        raise StateOutOfRange(f"state snapshot tensor {count!r} is {n:g}, not a count")
    if total not in cap or total not in row:
        return
    if (row[total].double().abs() > cap[total] * max(n, 1.0)).any():
        raise StateOutOfRange(
            f"state snapshot tensor {total!r} is larger than {count} positions reach"
        )


def check_state(row: dict[str, torch.Tensor], bounds: dict[str, torch.Tensor] | None) -> None:
    """Refuse a row (per-row tensors) with non-finite values or values past `bounds`."""
    for name, t in row.items():
        if (t.is_floating_point() or t.is_complex()) and not torch.isfinite(t).all():
            raise StateOutOfRange(f"state snapshot tensor {name!r} has non-finite values")
    cap = {k: v for k, v in (bounds or {}).items() if k in row}
    if "ssm" in row and "ssm" not in cap:  # (no model bound: the generic cap still applies)
        cap["ssm"] = torch.full(row["ssm"].shape, STATE_ABS_CAP, dtype=torch.float64)
    if "ssm" in cap:
        over = row["ssm"].to(torch.complex128).abs() > cap["ssm"]
        if over.any():
            worst = row["ssm"].to(torch.complex128).abs().max().item()
            raise StateOutOfRange(
                f"state snapshot tensor 'ssm' holds |x| = {worst:.3g}, beyond what this model "
                f"reaches (at most {cap['ssm'].max().item():.3g} per element)"
            )
    pairs = (("mean_count", "mean_sum"), ("feat_count", "feat_sum"), ("pcen_count", "pcen_sum"))
    for count, total in pairs:
        if count in row:
            _check_count(row, count, total, cap)
    if "pcen_sum" in row and (row["pcen_sum"] < 0).any():  # sums of energies: never negative
        raise StateOutOfRange("state snapshot tensor 'pcen_sum' holds negative energies")
    for name in ("frame_buf", "frame_hist", "embed_cache"):
        if name in row and (row[name].abs() > STATE_ABS_CAP).any():
            raise StateOutOfRange(f"state snapshot tensor '{name}' holds out-of-range values")
