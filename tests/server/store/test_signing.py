"""Signed portable state: round trip, each refusal reason, and fuzzing (hypothesis) that no
crafted or damaged envelope verifies and that verification allocates within its bound."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import struct
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dlr_runtime.engine import snapshot
from server.store.signing import (
    MAX_HEADER_BYTES,
    OVERHEAD,
    EnvelopeError,
    Reason,
    StateSigner,
)

SECRET = b"s" * 32
MH = "ab" * 32  # a model content hash
CAP = 4096  # max_payload_bytes in these tests
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
signer = StateSigner(SECRET)


def verify(blob, **kw):
    args = dict(model_hash=MH, state_version=1, max_payload_bytes=CAP) | kw
    return signer.verify(blob, **args)


def refused(blob, **kw) -> Reason:
    with pytest.raises(EnvelopeError) as e:
        verify(blob, **kw)
    return e.value.reason


def test_round_trip_of_a_real_snapshot() -> None:
    row = {"h": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    payload = snapshot.pack("tiny", "c" * 64, row, {"kind": "text"})
    blob = signer.sign(payload, "tiny", MH, snapshot.SNAPSHOT_VERSION, ttl_s=60, sid="f" * 32)
    v = verify(blob, state_version=snapshot.SNAPSHOT_VERSION, sid="f" * 32)
    assert v.payload == payload
    assert (v.header.model, v.header.model_hash, v.header.sid) == ("tiny", MH, "f" * 32)
    assert v.header.exp - v.header.iat == pytest.approx(60)
    assert refused(payload) is Reason.UNSIGNED  # the bare snapshot is refused
    assert len(blob) - len(payload) <= OVERHEAD + MAX_HEADER_BYTES


def test_each_refusal_names_its_reason() -> None:
    blob = signer.sign(b"p" * 100, "m", MH, 1, ttl_s=10, now=1000.0)
    assert verify(blob, now=1005.0).payload == b"p" * 100
    assert refused(blob, now=1010.0) is Reason.EXPIRED
    assert refused(blob, model_hash="cd" * 32, now=1005.0) is Reason.WRONG_MODEL
    assert refused(blob, state_version=2, now=1005.0) is Reason.WRONG_VERSION
    assert refused(blob, sid="0" * 32, now=1005.0) is Reason.WRONG_SESSION
    assert refused(blob, now=500.0) is Reason.NOT_YET_VALID
    assert refused(blob[:-1], now=1005.0) is Reason.TRUNCATED
    assert refused(blob[:10], now=1005.0) is Reason.TRUNCATED
    assert refused(blob + b"x", now=1005.0) is Reason.MALFORMED
    assert refused(blob, max_payload_bytes=50) is Reason.TOO_LARGE
    assert refused(b"") is Reason.UNSIGNED
    assert refused(b"DLRSIG" + struct.pack("<H", 2) + blob[8:]) is Reason.WRONG_VERSION
    other = StateSigner(b"t" * 32).sign(b"p" * 100, "m", MH, 1)
    assert refused(other) is Reason.BAD_SIGNATURE
    flipped = bytearray(blob)
    flipped[-40] ^= 1  # a payload byte
    assert refused(bytes(flipped), now=1005.0) is Reason.BAD_SIGNATURE
    with pytest.raises(EnvelopeError) as e:
        verify(blob, now=1010.0)
    assert e.value.status == 410 and "expired" in str(e.value)


def test_previous_secrets_still_verify_and_new_blobs_use_the_current_one() -> None:
    old = StateSigner(b"o" * 32).sign(b"x", "m", MH, 1)
    rotated = StateSigner(SECRET, previous=[b"o" * 32])
    assert rotated.verify(old, MH, 1, CAP).payload == b"x"
    assert verify(rotated.sign(b"y", "m", MH, 1)).payload == b"y"


def test_secret_from_env_and_generated_when_unset(caplog) -> None:
    s = StateSigner.from_env({"DLR_STATE_SECRET": "k" * 20})
    assert not s.generated
    assert StateSigner(b"k" * 20).verify(s.sign(b"z", "m", MH, 1), MH, 1, CAP).payload == b"z"
    with caplog.at_level(logging.WARNING, logger="dlr.store"):
        g = StateSigner.from_env({})
    assert g.generated and "DLR_STATE_SECRET is not set" in caplog.text
    with pytest.raises(ValueError, match="at least 16 bytes"):
        StateSigner.from_env({"DLR_STATE_SECRET": "short"})


# ---- fuzzing

SIGNED = signer.sign(b"payload-" * 64, "m", MH, 1, ttl_s=1e6)


@FUZZ
@given(st.binary(max_size=3 * CAP))
def test_random_bytes_never_verify(data: bytes) -> None:
    refused(data)
    refused(b"DLRSIG" + data)
    refused(SIGNED[:20] + data)


@FUZZ
@given(st.integers(0, len(SIGNED) - 1), st.integers(1, 255))
def test_any_flipped_byte_is_refused(pos: int, xor: int) -> None:
    b = bytearray(SIGNED)
    b[pos] ^= xor
    refused(bytes(b))


@FUZZ
@given(st.integers(0, len(SIGNED) - 1), st.binary(min_size=1, max_size=64))
def test_any_truncation_or_extension_is_refused(cut: int, tail: bytes) -> None:
    assert refused(SIGNED[:cut]) in (Reason.TRUNCATED, Reason.UNSIGNED)
    refused(SIGNED + tail)
    # (a tail equal to the bytes cut off rebuilds the signed blob itself, which is valid)
    assume(SIGNED[:cut] + tail != SIGNED)
    refused(SIGNED[:cut] + tail)


headers = st.fixed_dictionaries(
    {
        "model": st.text(max_size=20),
        "model_hash": st.sampled_from([MH, "cd" * 32, ""]),
        "state_version": st.one_of(st.integers(-2, 3), st.none(), st.text(max_size=3)),
        "iat": st.one_of(st.floats(allow_nan=True), st.none()),
        "exp": st.one_of(st.floats(allow_nan=True), st.none()),
        "sid": st.one_of(st.none(), st.text(max_size=40)),
    }
)


@FUZZ
@given(headers, st.binary(max_size=512), st.binary(min_size=1, max_size=64))
def test_crafted_envelopes_without_the_secret_are_refused(head, payload, key) -> None:
    """An attacker who knows the format but not the secret: whatever header and MAC it
    forges (including a MAC under a guessed key), the envelope is refused."""
    hdr = json.dumps(head).encode()[:MAX_HEADER_BYTES]
    body = struct.pack("<6sHIQ", b"DLRSIG", 1, len(hdr), len(payload)) + hdr + payload
    for mac in (hmac.new(key, body, hashlib.sha256).digest(), hashlib.sha256(body).digest()):
        assert refused(body + mac) is Reason.BAD_SIGNATURE


@FUZZ
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.binary(max_size=2 * CAP))
def test_verification_allocates_within_its_bound(hlen: int, nbytes: int, rest: bytes) -> None:
    """Whatever lengths a blob claims, verifying it allocates at most the payload bound plus
    the header bound (plus a small constant), never what the blob asks for."""
    blob = struct.pack("<6sHIQ", b"DLRSIG", 1, hlen, nbytes) + rest
    tracemalloc.start()
    try:
        with pytest.raises(EnvelopeError):
            verify(blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= CAP + MAX_HEADER_BYTES + 16_384


def test_a_valid_envelope_allocates_one_payload_copy() -> None:
    big = signer.sign(b"\0" * 400_000, "m", MH, 1)
    tracemalloc.start()
    try:
        signer.verify(big, MH, 1, max_payload_bytes=400_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 400_000 <= peak <= 400_000 + MAX_HEADER_BYTES + 16_384


@FUZZ
@given(
    st.binary(max_size=CAP),
    st.text(max_size=40),
    st.one_of(st.none(), st.text(max_size=40)),
    st.one_of(st.none(), st.floats(1, 1e9)),
)
def test_any_signed_state_round_trips(payload, model, sid, ttl) -> None:
    v = verify(signer.sign(payload, model, MH, 1, ttl_s=ttl, sid=sid), sid=sid)
    assert v.payload == payload and v.header.model == model and v.header.sid == sid
