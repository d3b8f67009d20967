"""The schema of a state snapshot's JSON header, checked before anything is allocated.

A header is plain JSON (no NaN/Infinity, nesting at most `MAX_DEPTH`) of the form
`{"model", "config_hash", "tensors": [{"name", "dtype", "shape", "offset", "nbytes"}], "extra"}`.
Tensor byte ranges must lie inside the payload and match their shape and dtype. `extra` is
caller data; the stream-position fields that callers keep there (the server's session
bookkeeping: positions, counters, ids, the resampler state, the speech start) are typed and
range-checked here so that no caller ever converts an unchecked value. Unknown `extra` keys
pass as plain JSON. Every problem raises `SnapshotHeaderError` naming the field.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .resample import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, ResamplerState

MAX_DEPTH = 32  # deepest nesting of arrays/objects a header may have
MAX_TENSORS = 64
DTYPES = ("float32", "float64", "complex64", "complex128", "int64", "int32", "float16", "bfloat16")
_ITEMSIZE = {"float32": 4, "float64": 8, "complex64": 8, "complex128": 16, "int64": 8}
_ITEMSIZE |= {"int32": 4, "float16": 2, "bfloat16": 2}

Count = Annotated[int, Field(ge=0, le=1 << 53)]  # non-negative, exact as a float64
HexId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]  # a session id: uuid4 hex


class SnapshotHeaderError(ValueError):
    """A header that is not plain JSON or does not fit the schema (the message names the field)."""


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=64)
    dtype: Literal[DTYPES]  # type: ignore[valid-type]
    shape: list[Count] = Field(max_length=8)
    offset: Count
    nbytes: Count

    @model_validator(mode="after")
    def _size(self) -> TensorSpec:
        numel = 1
        for d in self.shape:
            numel *= d
        if numel * _ITEMSIZE[self.dtype] != self.nbytes:
            raise ValueError(f"nbytes {self.nbytes} does not match shape {self.shape}")
        return self


class SpeechStartFields(BaseModel):
    """The speech session's start message as kept in `extra.start` (other keys are the caller's)."""

    model_config = ConfigDict(extra="allow", strict=True)

    sample_rate: int = Field(ge=MIN_SAMPLE_RATE, le=MAX_SAMPLE_RATE)


class SessionFields(BaseModel):
    """Stream-position fields a caller may keep in `extra`; each is optional, typed if present."""

    model_config = ConfigDict(extra="allow", strict=True)

    kind: Literal["speech", "text"] | None = None
    session_id: HexId | None = None
    token_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    consumed: Count | None = None
    bytes_received: Count | None = None
    appended: Count | None = None
    messages_received: Count | None = None
    seq: Count | None = None
    sent_seq: Count | None = None
    completed: bool | None = None
    pending: list[Annotated[int, Field(ge=0, lt=1 << 31)]] | None = Field(None, max_length=4096)
    buffered: str | None = None
    last_logits: str | None = None
    outbox: list[Any] | None = None
    resampler: ResamplerState | None = None
    start: SpeechStartFields | None = None


class Header(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, max_length=256)
    config_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    tensors: list[TensorSpec] = Field(max_length=MAX_TENSORS)
    extra: SessionFields = Field(default_factory=SessionFields)


def _check_tree(obj: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH and non-finite numbers, naming where (iterative)."""
    todo: list[tuple[Any, int, str]] = [(obj, 0, "")]
    while todo:
        o, depth, path = todo.pop()
        if isinstance(o, float) and not math.isfinite(o):
            where = path.lstrip(".") or "header"
            raise SnapshotHeaderError(
                f"state snapshot header field {where} holds {o}, which is not plain JSON"
            )
        if isinstance(o, (dict, list)):
            if depth >= MAX_DEPTH:
                raise SnapshotHeaderError(
                    f"state snapshot header is nested deeper than {MAX_DEPTH} levels"
                )
            items = o.items() if isinstance(o, dict) else enumerate(o)
            todo.extend((v, depth + 1, f"{path}.{k}") for k, v in items)


def parse_header_json(raw: bytes) -> dict:
    """Header bytes -> dict: UTF-8, plain JSON, nested at most MAX_DEPTH, an object."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SnapshotHeaderError(f"state snapshot header is not valid JSON: {e}") from None
    except RecursionError:
        raise SnapshotHeaderError(
            f"state snapshot header is nested deeper than {MAX_DEPTH} levels"
        ) from None
    if not isinstance(obj, dict):
        raise SnapshotHeaderError("state snapshot header is not a JSON object")
    _check_tree(obj)
    return obj


def validate_header(header: dict, payload_bytes: int) -> None:
    """Check `header` against the schema and every tensor's byte range against the payload."""
    try:
        h = Header.model_validate(header)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "header"
        raise SnapshotHeaderError(f"state snapshot header field {where}: {err['msg']}") from None
    for i, t in enumerate(h.tensors):
        if t.offset + t.nbytes > payload_bytes:
            raise SnapshotHeaderError(
                f"state snapshot header field tensors.{i}: bytes {t.offset}..{t.offset + t.nbytes}"
                f" lie outside the {payload_bytes}-byte payload"
            )
