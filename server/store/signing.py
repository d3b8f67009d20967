"""Signed portable state: an HMAC-SHA256 envelope around a state snapshot.

Every blob that leaves the process (export via /v1/sessions, resume tokens, stored snapshots)
is wrapped so that only a server holding the secret can have made it, for this model, in this
format, recently. Layout (integers little-endian):

    magic    b"DLRSIG"                                   6 bytes
    version  uint16 (ENVELOPE_VERSION)                   2 bytes
    hlen     uint32, <= MAX_HEADER_BYTES                 4 bytes
    nbytes   uint64, the payload's length                8 bytes
    header   JSON, hlen bytes: {"model", "model_hash", "state_version", "iat", "exp", "sid"}
    payload  nbytes bytes (a dlr_runtime snapshot, opaque here)
    mac      HMAC-SHA256(secret, everything above)       32 bytes

`verify` checks, in this order and before parsing anything it has not authenticated: the
total size against the caller's bound (`max_payload_bytes`), the magic (else UNSIGNED), the
envelope version, the framing lengths (TRUNCATED / MALFORMED), the MAC with
`hmac.compare_digest` against the current and any previous secrets (BAD_SIGNATURE), then the
header: state format version, model content hash, session id when bound, issue and expiry
times. Each refusal is an `EnvelopeError` whose `reason` names it (`status` is the HTTP status
the server should answer). Verification allocates at most one copy of the payload (bounded by
`max_payload_bytes`) plus MAX_HEADER_BYTES, whatever the blob claims.

The secret is `DLR_STATE_SECRET` (at least 16 bytes; the same on every replica);
`DLR_STATE_SECRET_PREVIOUS` (comma-separated) still verifies during a rotation. When unset a
random secret is generated and a warning logged: blobs then verify only in this process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum

log = logging.getLogger("dlr.store")

MAGIC = b"DLRSIG"
ENVELOPE_VERSION = 1
MAX_HEADER_BYTES = 1024
MIN_SECRET_BYTES = 16
CLOCK_SKEW_S = 60.0  # issued-at may be this far in the future (replica clocks differ)
_PREFIX = struct.Struct("<6sHIQ")  # magic, version, hlen, nbytes
_MAC = 32
OVERHEAD = _PREFIX.size + _MAC


class Reason(StrEnum):
    TOO_LARGE = "too_large"
    UNSIGNED = "unsigned"
    WRONG_VERSION = "wrong_version"
    TRUNCATED = "truncated"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    WRONG_MODEL = "wrong_model"
    WRONG_SESSION = "wrong_session"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"


STATUS: dict[Reason, int] = {  # the HTTP answer for each refusal
    Reason.TOO_LARGE: 413,
    Reason.WRONG_MODEL: 409,
    Reason.EXPIRED: 410,
}


class EnvelopeError(ValueError):
    """A portable state blob was refused; `reason` says why, `status` is the HTTP status."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = STATUS.get(reason, 400)


@dataclass(frozen=True)
class EnvelopeHeader:
    model: str  # the model's name (informative; the hash is what binds)
    model_hash: str  # the model's content hash (config + state layout + weights)
    state_version: int  # the snapshot format version of the payload
    iat: float  # issued at, seconds since the epoch
    exp: float | None  # expires at (None: never)
    sid: str | None = None  # the session it belongs to, when bound


@dataclass(frozen=True)
class Verified:
    header: EnvelopeHeader
    payload: bytes


class StateSigner:
    """Signs and verifies envelopes with one secret (plus previous ones for verifying)."""

    def __init__(
        self, secret: bytes, previous: Sequence[bytes] = (), generated: bool = False
    ) -> None:
        for s in (secret, *previous):
            if len(s) < MIN_SECRET_BYTES:
                raise ValueError(f"a state secret needs at least {MIN_SECRET_BYTES} bytes")
        self._keys = (bytes(secret), *map(bytes, previous))
        self.generated = generated  # True: random, this process only

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StateSigner:
        env = os.environ if environ is None else environ
        prev = [p.encode() for p in env.get("DLR_STATE_SECRET_PREVIOUS", "").split(",") if p]
        secret = env.get("DLR_STATE_SECRET", "")
        if secret:
            return cls(secret.encode(), prev)
        log.warning(
            "DLR_STATE_SECRET is not set: generated a random state secret; exported and "
            "stored session states will verify only in this process (set the same secret on "
            "every replica)"
        )
        return cls(secrets.token_bytes(32), prev, generated=True)

    def sign(
        self,
        payload: bytes,
        model: str,
        model_hash: str,
        state_version: int,
        ttl_s: float | None = None,
        sid: str | None = None,
        now: float | None = None,
    ) -> bytes:
        """The envelope of `payload` (expiring `ttl_s` from now when given)."""
        t = time.time() if now is None else now
        head = EnvelopeHeader(
            model, model_hash, state_version, t, None if ttl_s is None else t + ttl_s, sid
        )
        hdr = json.dumps(asdict(head), separators=(",", ":"), sort_keys=True).encode()
        if len(hdr) > MAX_HEADER_BYTES:
            raise ValueError(f"envelope header is {len(hdr)} bytes (max {MAX_HEADER_BYTES})")
        body = _PREFIX.pack(MAGIC, ENVELOPE_VERSION, len(hdr), len(payload)) + hdr + payload
        return body + hmac.new(self._keys[0], body, hashlib.sha256).digest()

    def verify(
        self,
        blob: bytes | bytearray | memoryview,
        model_hash: str,
        state_version: int,
        max_payload_bytes: int,
        sid: str | None = None,
        now: float | None = None,
    ) -> Verified:
        """The header and payload of a valid envelope; `EnvelopeError` otherwise (see the
        module docstring for the order of the checks)."""
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise EnvelopeError(Reason.MALFORMED, "portable state must be bytes")
        mv = memoryview(blob).cast("B")
        n = len(mv)
        limit = max_payload_bytes + MAX_HEADER_BYTES + OVERHEAD
        if n > limit:
            raise EnvelopeError(Reason.TOO_LARGE, f"portable state of {n} bytes exceeds {limit}")
        if n < len(MAGIC) or bytes(mv[: len(MAGIC)]) != MAGIC:
            what = "a raw state snapshot" if bytes(mv[:8]) == b"DLRSTATE" else "not a signed state"
            raise EnvelopeError(Reason.UNSIGNED, f"portable state is unsigned ({what})")
        if n < _PREFIX.size:
            raise EnvelopeError(Reason.TRUNCATED, "portable state is truncated (no header)")
        _, version, hlen, nbytes = _PREFIX.unpack_from(mv)
        if version != ENVELOPE_VERSION:
            raise EnvelopeError(
                Reason.WRONG_VERSION,
                f"portable state envelope version {version} is not supported (this server reads {ENVELOPE_VERSION})",
            )
        if hlen > MAX_HEADER_BYTES:
            raise EnvelopeError(Reason.MALFORMED, f"portable state header of {hlen} bytes")
        if nbytes > max_payload_bytes:
            raise EnvelopeError(
                Reason.TOO_LARGE,
                f"portable state payload of {nbytes} bytes exceeds {max_payload_bytes}",
            )
        want = _PREFIX.size + hlen + nbytes + _MAC
        if n < want:
            raise EnvelopeError(
                Reason.TRUNCATED, f"portable state is truncated ({n} of {want} bytes)"
            )
        if n > want:
            raise EnvelopeError(Reason.MALFORMED, f"portable state has {n - want} trailing bytes")
        body, mac = mv[: n - _MAC], mv[n - _MAC :]
        ok = False
        for key in self._keys:  # every key is tried: the time does not say which one matched
            ok |= hmac.compare_digest(hmac.new(key, body, hashlib.sha256).digest(), mac)
        if not ok:
            raise EnvelopeError(
                Reason.BAD_SIGNATURE,
                "portable state signature does not match (modified, or signed with another secret)",
            )
        head = _header(bytes(mv[_PREFIX.size : _PREFIX.size + hlen]))
        if head.state_version != state_version:
            raise EnvelopeError(
                Reason.WRONG_VERSION,
                f"portable state has snapshot format {head.state_version}, this server reads {state_version}",
            )
        if not hmac.compare_digest(head.model_hash.encode(), model_hash.encode()):
            raise EnvelopeError(
                Reason.WRONG_MODEL,
                f"portable state is for another model or model version ({head.model!r})",
            )
        if sid is not None and head.sid != sid:
            raise EnvelopeError(Reason.WRONG_SESSION, "portable state belongs to another session")
        t = time.time() if now is None else now
        if head.exp is not None and head.exp <= t:
            raise EnvelopeError(Reason.EXPIRED, f"portable state expired {t - head.exp:.0f} s ago")
        if head.iat > t + CLOCK_SKEW_S:
            raise EnvelopeError(Reason.NOT_YET_VALID, "portable state is issued in the future")
        start = _PREFIX.size + hlen
        return Verified(head, bytes(mv[start : start + nbytes]))


def _header(raw: bytes) -> EnvelopeHeader:
    """Parse an authenticated header (still checked: a signer bug must not crash a server)."""
    try:
        d = json.loads(raw)
        head = EnvelopeHeader(
            model=d["model"],
            model_hash=d["model_hash"],
            state_version=d["state_version"],
            iat=d["iat"],
            exp=d["exp"],
            sid=d.get("sid"),
        )
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise EnvelopeError(Reason.MALFORMED, f"portable state header is malformed: {e}") from None
    types_ok = (
        isinstance(head.model, str)
        and isinstance(head.model_hash, str)
        and type(head.state_version) is int
        and _time(head.iat)
        and (head.exp is None or _time(head.exp))
        and (head.sid is None or isinstance(head.sid, str))
    )
    if not types_ok:
        raise EnvelopeError(Reason.MALFORMED, "portable state header has fields of wrong types")
    return head


def _time(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
