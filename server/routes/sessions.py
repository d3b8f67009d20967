"""Session state export/import: move a live WebSocket session to another replica.

- `GET /v1/sessions/{session_id}/state` with header `X-Resume-Token: <token>`: the session's
  engine snapshot (`application/octet-stream`; versioned, sha256-checked, carrying the model
  name and config hash; see dlr_runtime/engine/snapshot.py) plus the session's position.
  A text session is exported between turns (409 while generating).
- `POST /v1/sessions` with such a blob as the body: creates a detached session on this server
  (201 `{"session_id","resume_token","model","kind","resume_grace_s"}`); connect to the kind's
  WebSocket and send `resume` to continue.

Exported blobs are signed (an HMAC envelope with `DLR_STATE_SECRET`, bound to the model's
content hash and the snapshot format; server/store/signing.py): only a server with the same
secret imports them. Refusals name the reason (`unsigned`, `bad_signature`, `truncated`,
`malformed`, `wrong_version`, ...) in the message: 400 `invalid_state`; a blob of a model this
server does not serve (or of other weights) 409 `state_model_mismatch`; an expired one 410
`state_expired`; a too large one 413 `too_large`.

- `POST /v1/sessions/{session_id}/fork` with `X-Resume-Token`: a new detached text session
  holding a copy of the state (201, same body as the import); resume it on the text WebSocket.
  The WebSocket message `{"type": "fork"}` does the same inside a connection.

`restore_blob` (server/sessions/restore.py) is also how the drain's persisted states come back at start-up.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response

from dlr_runtime.engine import SnapshotError

from ..admission import pool_full, refusal
from ..errors import Closed, api_error
from ..sessions.restore import NoCapacity, StateMismatch, restore_blob, unseal
from ..sessions.store import LiveSession, SessionStore, StoreDep
from ..sessions.text import ForkRefused, TextLive
from ..sessions.tokens import TokenRefused
from ..store import EnvelopeError, Reason

CODES = {
    Reason.WRONG_MODEL: "state_model_mismatch",
    Reason.EXPIRED: "state_expired",
    Reason.TOO_LARGE: "too_large",
}

router = APIRouter()


@router.get(
    "/v1/sessions/{session_id}/state",
    responses={200: {"content": {"application/octet-stream": {}}}, 404: {}, 409: {}},
)
async def export_state(
    session_id: str,
    store: StoreDep,
    x_resume_token: str = Header(default="", max_length=1024),
) -> Response:
    sess = _verified(store, session_id, x_resume_token)
    if isinstance(sess, Response):
        return sess
    try:
        blob = await sess.export()
    except SnapshotError as e:
        return api_error(409, str(e), "session_busy")
    store.ctx.metrics.resumes.labels(sess.kind, "export").inc()
    assert store.ctx.durable is not None  # (opened before the server serves)
    return Response(
        store.ctx.durable.seal(sess.m, blob),
        media_type="application/octet-stream",
        headers={"X-Session-Kind": sess.kind, "X-Model": sess.m.name},
    )


@router.post(
    "/v1/sessions",
    status_code=201,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
    responses={400: {}, 409: {}, 413: {}, 429: {}, 503: {}},
)
async def import_state(request: Request, store: StoreDep) -> Response:
    st = store.ctx
    r = refusal(st) if st.draining else None  # (capacity is checked once the blob is read)
    if r is not None:
        return r.response()
    limit = st.settings.max_state_bytes
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return api_error(413, f"state blob larger than max_state_bytes={limit}", "too_large")
    try:
        payload = unseal(st, bytes(body)).payload
    except EnvelopeError as e:
        st.metrics.rejections.labels(f"state_{e.reason}").inc()
        message = f"state refused ({e.reason}): {e}"
        return api_error(e.status, message, CODES.get(e.reason, "invalid_state"))
    try:
        sess = await restore_blob(store, payload)
    except SnapshotError as e:
        return api_error(400, str(e), "invalid_state")
    except StateMismatch as e:
        return api_error(409, str(e), "state_model_mismatch", "model")
    except NoCapacity as e:
        return e.refusal.response()
    st.metrics.resumes.labels(sess.kind, "import").inc()
    await asyncio.sleep(0)
    return _created(store, sess)


@router.post("/v1/sessions/{session_id}/fork", status_code=201, responses={404: {}, 409: {}})
async def fork_session(
    session_id: str,
    store: StoreDep,
    x_resume_token: str = Header(default="", max_length=1024),
) -> Response:
    sess = _verified(store, session_id, x_resume_token)
    if isinstance(sess, Response):
        return sess
    if not isinstance(sess, TextLive):
        return api_error(409, "only text sessions can be forked", "not_forkable")
    await sess.wait_turn()
    try:
        async with sess.turn_lock:
            await sess.unpark(None)  # a parked session comes back into a slot first
            new = await sess.fork()
    except Closed as e:
        if str(e) == "overloaded":
            return pool_full(store.ctx, sess.m).response()
        return api_error(410, "the session's parked state was lost", str(e))
    except ForkRefused as e:
        if e.refusal is not None:
            return e.refusal.response()
        return api_error(409, str(e), e.code)
    store.ctx.metrics.resumes.labels(new.kind, "fork").inc()
    return _created(store, new, forked_from=sess.sid)


def _verified(store: SessionStore, sid: str, token: str) -> LiveSession | Response:
    """The session `token` opens, or the 4xx response saying why not."""
    try:
        sess = store.verify(sid, token) if token else None
    except TokenRefused as e:
        return _refused(e)
    return _unknown() if sess is None else sess


def _refused(e: TokenRefused) -> Response:
    """A token that is not a valid signed token of the session: 4xx naming the reason."""
    return api_error(e.status, str(e), f"resume_token_{e.reason}", "X-Resume-Token")


def _unknown() -> Response:
    return api_error(
        404, "unknown session id or wrong X-Resume-Token", "session_not_found", "session_id"
    )


def _created(store: SessionStore, sess: LiveSession, **extra: str) -> Response:
    """201 with what a client needs to resume a new detached session."""
    body = {
        "session_id": sess.sid,
        "resume_token": sess.token,
        "model": sess.m.name,
        "kind": sess.kind,
        "resume_grace_s": store.ctx.settings.resume_grace_s,
        **extra,
    }
    return JSONResponse(body, status_code=201)
