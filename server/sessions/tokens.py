"""Signed resume tokens: `dlrt1.` + base64url of a signed envelope (server/store/signing.py).

A session's resume token is an HMAC envelope (`DLR_STATE_SECRET`, shared by replicas) whose
payload is the session's 32-byte random secret, bound to the session id, the model's content
hash and the token format (`TOKEN_VERSION`, distinct from every snapshot format, so a token is
never taken for a state blob nor the other way round), expiring `state_ttl_s` after it was
issued (0: never). The server keeps only the sha256 of the secret (`LiveSession.token_hash`,
also in checkpoints), so the token itself is never stored; a resume renews it (same secret, a
new expiry) in its `ready`.

`open_token(ctx, sid, token)` returns the secret of a valid token or raises `TokenRefused`
whose `reason` names why (unsigned, malformed, truncated, bad_signature, wrong_model,
wrong_session, wrong_version, expired, ...) and `status` is the HTTP answer (400/409/410).

Without `DLR_STATE_SECRET` the signer's secret is random and dies with the process, so a
signature could not survive the SIGTERM drain and restart (`DLR_STATE_DIR`) that resume
tokens always survived: such a server issues raw tokens (`dlrr1.` + the secret in hex: still
unforgeable, only its hash is kept) and accepts raw and its own signed tokens. A server with
the secret set refuses raw tokens (`unsigned`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets

from ..context import AppContext
from ..registry import ModelEntry
from ..store import EnvelopeError, Reason

PREFIX = "dlrt1."
RAW = "dlrr1."  # a token that is only the secret (servers without DLR_STATE_SECRET)
TOKEN_VERSION = 0x10001  # the "state_version" of a token envelope (no snapshot format)
SECRET_BYTES = 32
MAX_TOKEN_CHARS = 1024


class TokenRefused(ValueError):
    def __init__(self, reason: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.reason, self.status = reason, status


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def secret_hash(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def issue(ctx: AppContext, m: ModelEntry, sid: str, secret: bytes) -> str:
    """The resume token of session `sid` (model `m`) holding `secret`."""
    d = ctx.durable
    if d is None or d.signer.generated:
        return RAW + secret.hex()
    ttl = ctx.settings.state_ttl_s or None
    blob = d.signer.sign(secret, m.name, m.engine.config_hash, TOKEN_VERSION, ttl, sid)
    return PREFIX + base64.urlsafe_b64encode(blob).rstrip(b"=").decode("ascii")


def open_token(ctx: AppContext, sid: object, token: object) -> bytes:
    """The secret of a valid resume token of session `sid` (TokenRefused otherwise)."""
    if not isinstance(token, str) or not isinstance(sid, str):
        raise TokenRefused("malformed", "the resume token and session id must be strings")
    if len(token) > MAX_TOKEN_CHARS:
        raise TokenRefused("too_large", f"the resume token is longer than {MAX_TOKEN_CHARS}")
    d = ctx.durable
    if token.startswith(RAW):
        if d is not None and not d.signer.generated:
            raise TokenRefused("unsigned", "this server takes signed resume tokens only")
        try:
            secret = bytes.fromhex(token[len(RAW) :])
        except ValueError:
            raise TokenRefused("malformed", "the resume token is not hex") from None
        if len(secret) != SECRET_BYTES:
            raise TokenRefused("malformed", "the resume token carries no session secret")
        return secret
    if d is None or not token.startswith(PREFIX):
        raise TokenRefused("unsigned", "the resume token is not a signed token of this server")
    body = token[len(PREFIX) :]
    try:
        blob = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise TokenRefused("malformed", "the resume token is not base64url") from None
    wrong: EnvelopeError | None = None
    for m in ctx.models.values():  # the token names its model by content hash only
        try:
            v = d.signer.verify(blob, m.engine.config_hash, TOKEN_VERSION, SECRET_BYTES, sid)
        except EnvelopeError as e:
            if e.reason != Reason.WRONG_MODEL:
                raise TokenRefused(str(e.reason), f"resume token refused: {e}", e.status) from None
            wrong = e
            continue
        if len(v.payload) != SECRET_BYTES:
            raise TokenRefused("malformed", "the resume token carries no session secret")
        return v.payload
    status = wrong.status if wrong is not None else 409
    raise TokenRefused(
        str(Reason.WRONG_MODEL),
        "resume token refused: it is for a model this server does not serve",
        status,
    )
