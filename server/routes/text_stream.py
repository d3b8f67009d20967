"""`WS /v1/generate/stream`: a persistent text session whose state carries the conversation.

Client `{"type":"start","model"}` -> `{"type":"ready","session_id","model"}`;
`{"type":"append","text"}` prefills the text into the state (no reply);
`{"type":"generate", max_new_tokens, temperature, top_k, top_p, seed, stop}` streams
`{"type":"token","text","id"}` messages then `{"type":"done","finish_reason","usage","seed"}`.
Generated tokens stay in the state, so each turn costs only its own new tokens.
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket
from pydantic import TypeAdapter, ValidationError

from dlr_runtime.engine import PoolFullError

from ..errors import validation_message
from ..protocol import TextAppend, TextMessage, TextStart
from ..registry import ModelEntry
from ..scheduler import TextSession
from ..state import NoModelError, get_state
from .wsutil import Closed, Conn

router = APIRouter()
_parse = TypeAdapter(TextMessage)


class Session:
    def __init__(self, m: ModelEntry, text: TextSession, sid: str, t0: float) -> None:
        self.m, self.text, self.sid, self.t0 = m, text, sid, t0
        self.appended = 0  # tokens appended since the last generate (reported as prompt_tokens)
        self.g = None


@router.websocket("/v1/generate/stream")
async def generate_stream(ws: WebSocket) -> None:
    conn = Conn(ws, get_state(ws))
    st = conn.st
    sess: Session | None = None
    reason = "client_closed"
    try:
        await conn.admit()
        while True:
            text, data = await conn.receive()
            if data is not None:
                raise await conn.fail("invalid_message", "this endpoint takes JSON text messages")
            try:
                msg = _parse.validate_python(await conn.receive_json(text or ""))
            except ValidationError as e:
                raise await conn.fail("invalid_message", validation_message(e)[1]) from None
            if isinstance(msg, TextStart):
                if sess is not None:
                    _close(conn, sess, "restarted")
                    sess = None
                sess = await _start(conn, msg)
                await conn.send({"type": "ready", "session_id": sess.sid, "model": sess.m.name})
                continue
            if sess is None:
                raise await conn.fail("no_session", f"send start before {msg.type}")
            if isinstance(msg, TextAppend):
                if len(msg.text) > st.settings.max_prompt_chars:
                    raise await conn.fail(
                        "invalid_message",
                        f"text: longer than max_prompt_chars={st.settings.max_prompt_chars}",
                    )
                toks = sess.m.engine.tokenizer.encode(msg.text)
                if not toks:
                    continue
                feed = sess.text.pending + toks
                sess.text.pending = []
                sess.appended += len(feed)
                try:
                    await sess.m.scheduler.prefill(sess.text, feed)
                except Exception as e:  # noqa: BLE001  (its batch failed)
                    raise await conn.fail("internal_error", str(e)) from None
                continue
            if msg.max_new_tokens > st.settings.max_new_tokens:
                raise await conn.fail(
                    "invalid_message", f"max_new_tokens: at most {st.settings.max_new_tokens}"
                )
            await _generate(conn, sess, msg)
    except Closed as e:
        reason = str(e) or reason
    finally:
        if sess is not None:
            _close(conn, sess, reason)


async def _generate(conn: Conn, sess: Session, msg) -> None:
    params = msg.to_sampling(msg.max_new_tokens)
    prompt_tokens = sess.appended + len(sess.text.pending)
    sess.appended = 0
    if params.max_tokens == 0:
        await conn.send(
            {
                "type": "done",
                "finish_reason": "length",
                "seed": params.seed,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0},
            }
        )
        return
    g = sess.g = sess.m.scheduler.generate(sess.text, params)
    while True:
        ev = await g.events.get()
        if ev[0] == "token":
            await conn.send({"type": "token", "text": ev[2], "id": ev[1]})
        elif ev[0] == "done":
            if ev[2]:
                await conn.send({"type": "token", "text": ev[2], "id": None})
            await conn.send(
                {
                    "type": "done",
                    "finish_reason": ev[1],
                    "seed": params.seed,
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": g.n_generated},
                }
            )
            sess.g = None
            return
        else:
            raise await conn.fail("internal_error", str(ev[1]))


async def _start(conn: Conn, msg: TextStart) -> Session:
    st = conn.st
    try:
        m = st.pick_model(msg.model, "lm")
    except NoModelError as e:
        raise await conn.fail("unknown_model", str(e)) from None
    conn.model = m.name
    if st.full():
        st.metrics.rejections.labels("sessions_full").inc()
        raise await conn.fail("overloaded", "the server is at its session limit; retry later")
    try:
        slot = await m.scheduler.open_slot()
    except PoolFullError:
        st.metrics.rejections.labels("pool_full").inc()
        raise await conn.fail("overloaded", f"model {m.name!r} has no free session slot") from None
    sid, t0 = st.session_started(m, "text")
    return Session(m, TextSession(slot=slot, pending=[m.engine.tokenizer.bos]), sid, t0)


def _close(conn: Conn, sess: Session, reason: str) -> None:
    sess.m.scheduler.release(sess.text.slot, sess.text, sess.g)
    conn.st.session_ended(sess.sid, sess.m, "text", sess.t0, reason)
