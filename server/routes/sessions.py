"""Session state export/import: move a live WebSocket session to another replica.

- `GET /v1/sessions/{session_id}/state` with header `X-Resume-Token: <token>`: the session's
  engine snapshot (`application/octet-stream`; versioned, sha256-checked, carrying the model
  name and config hash; see dlr_runtime/engine/snapshot.py) plus the session's position.
  A text session is exported between turns (409 while generating).
- `POST /v1/sessions` with such a blob as the body: creates a detached session on this server
  (201 `{"session_id","resume_token","model","kind","resume_grace_s"}`); connect to the kind's
  WebSocket and send `resume` to continue. A tampered or malformed blob is refused with 400
  `invalid_state`, a blob of a model this server does not serve (or of another config) with
  409 `state_model_mismatch`.

`restore_blob` is also how the drain's persisted states come back at start-up.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response

from dlr_runtime.engine import PoolFullError, SnapshotError
from dlr_runtime.engine.snapshot import read_header

from ..errors import api_error
from ..sessions import LiveSession, Outbox
from ..state import ServerState, StateDep
from .speech import SpeechSession
from .text_stream import TextLive

router = APIRouter()
KINDS: dict[str, type] = {"speech": SpeechSession, "text": TextLive}


class StateMismatch(Exception):
    """The blob is valid but belongs to a model (or config) this server does not serve."""


class NoCapacity(Exception):
    """No free slot or session for the restored session."""


async def restore_blob(st: ServerState, blob: bytes, persisted: bool = False) -> LiveSession:
    """Create a detached session from a state blob. With `persisted`, the session keeps its
    id, token hash and replay buffer (a drain file); otherwise it gets new ones.

    Raises SnapshotError (malformed/tampered), StateMismatch, NoCapacity.
    """
    header = read_header(blob)
    extra = header.get("extra")
    if not isinstance(extra, dict) or extra.get("kind") not in KINDS:
        raise SnapshotError("state snapshot carries no session (extra.kind is missing)")
    m = st.models.get(header["model"]) if isinstance(header["model"], str) else None
    if m is None:
        raise StateMismatch(
            f"state is for model {header['model']!r}; this server serves {sorted(st.models)}"
        )
    if header["config_hash"] != m.engine.config_hash:
        raise StateMismatch(
            f"state is for another configuration of model {m.name!r} (config hash differs)"
        )
    cls = KINDS[extra["kind"]]
    if (cls is SpeechSession) != (m.kind == "speech"):
        raise SnapshotError("state session kind does not match the model")
    if st.full() or st.draining:
        raise NoCapacity("the server is at its session limit")
    kw: dict[str, Any] = {}
    if persisted:
        try:
            kw = {
                "sid": str(extra["session_id"]),
                "token_hash": bytes.fromhex(extra["token_sha256"]),
                "outbox": Outbox(
                    st.settings.resume_buffer_messages, int(extra["seq"]), list(extra["outbox"])
                ),
                "sent_seq": int(extra["sent_seq"]),
            }
        except (KeyError, TypeError, ValueError) as e:
            raise SnapshotError(f"persisted session fields are malformed: {e}") from e
        if kw["sid"] in st.store.live:
            raise SnapshotError(f"session {kw['sid']} is already live")
    try:
        slot = await m.scheduler.open_slot()
    except PoolFullError:
        raise NoCapacity(f"model {m.name!r} has no free session slot") from None
    try:
        await m.scheduler.run_sync(m.engine.restore, slot, blob)
        sess = cls.from_extra(st, m, slot, extra, **kw)
    except (KeyError, TypeError, ValueError, SnapshotError) as e:
        await m.scheduler.close_slot(slot)
        if isinstance(e, SnapshotError):
            raise
        raise SnapshotError(f"state snapshot session fields are malformed: {e}") from e
    if persisted and extra.get("completed"):
        sess.completed = True
    st.session_started(m, sess.kind, sess.sid)
    st.store.add(sess)
    st.store.detach(sess)
    return sess


@router.get(
    "/v1/sessions/{session_id}/state",
    responses={200: {"content": {"application/octet-stream": {}}}, 404: {}, 409: {}},
)
async def export_state(
    session_id: str,
    st: StateDep,
    x_resume_token: str = Header(default="", max_length=256),
) -> Response:
    sess = st.store.verify(session_id, x_resume_token)
    if sess is None:
        return api_error(
            404, "unknown session id or wrong X-Resume-Token", "session_not_found", "session_id"
        )
    try:
        blob = await sess.export()
    except SnapshotError as e:
        return api_error(409, str(e), "session_busy")
    st.metrics.resumes.labels(sess.kind, "export").inc()
    return Response(
        blob,
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
async def import_state(request: Request, st: StateDep) -> Response:
    if st.draining:
        return api_error(
            503,
            "the server is shutting down",
            "draining",
            headers={"Retry-After": str(st.settings.retry_after_s)},
        )
    limit = st.settings.max_state_bytes
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return api_error(413, f"state blob larger than max_state_bytes={limit}", "too_large")
    try:
        sess = await restore_blob(st, bytes(body))
    except SnapshotError as e:
        return api_error(400, str(e), "invalid_state")
    except StateMismatch as e:
        return api_error(409, str(e), "state_model_mismatch", "model")
    except NoCapacity as e:
        return api_error(
            429, str(e), "overloaded", headers={"Retry-After": str(st.settings.retry_after_s)}
        )
    st.metrics.resumes.labels(sess.kind, "import").inc()
    await asyncio.sleep(0)
    return JSONResponse(
        {
            "session_id": sess.sid,
            "resume_token": sess.token,
            "model": sess.m.name,
            "kind": sess.kind,
            "resume_grace_s": st.settings.resume_grace_s,
        },
        status_code=201,
    )
