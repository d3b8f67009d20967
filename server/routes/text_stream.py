"""`WS /v1/generate/stream`: a persistent text session whose state carries the conversation.

Client `{"type":"start","model"}` -> `{"type":"ready","session_id","resume_token","model"}`;
`{"type":"append","text"}` prefills the text into the state (no reply);
`{"type":"generate", max_new_tokens, temperature, top_k, top_p, seed, stop}` streams
`{"type":"token","text","id","seq"}` messages then `{"type":"done","finish_reason","usage",
"seed","seq"}`. Generated tokens stay in the state, so each turn costs only its own new tokens.

Resume (see server/sessions.py): a generation keeps running when the connection drops; its
tokens wait in the outbox and are re-sent after `resume` (`ready` carries `messages_received`,
the number of append/generate messages the server accepted: re-send the ones after it).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import torch
from fastapi import APIRouter, WebSocket
from pydantic import TypeAdapter, ValidationError

from dlr_runtime.engine import SnapshotError

from ..errors import validation_message
from ..protocol import TextAppend, TextMessage, TextStart
from ..registry import ModelEntry
from ..scheduler import TextSession
from ..sessions import LiveSession, connection_over, open_slot, register, resume
from ..state import ServerState, get_state
from .wsutil import Closed, Conn

router = APIRouter()
_parse = TypeAdapter(TextMessage)


class TextLive(LiveSession):
    kind = "text"

    def __init__(
        self,
        st: ServerState,
        m: ModelEntry,
        text: TextSession,
        appended: int = 0,
        messages_received: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(st, m, **kw)
        self.text = text
        self.appended = appended  # tokens appended since the last generate (prompt_tokens)
        self.messages_received = messages_received
        self.g = None
        self.pump: asyncio.Task | None = None

    def ready(self) -> dict:
        return {
            "type": "ready",
            "session_id": self.sid,
            "resume_token": self.token,
            "model": self.m.name,
        }

    def resume_info(self) -> dict:
        return {"messages_received": self.messages_received, "generating": self.g is not None}

    async def wait_turn(self) -> None:
        """Wait for the running generation (started on this or an earlier connection)."""
        if self.pump is not None:
            await asyncio.shield(self.pump)

    async def append(self, conn: Conn, msg: TextAppend) -> None:
        limit = self.st.settings.max_prompt_chars
        if len(msg.text) > limit:
            raise await self._fail(
                conn, "invalid_message", f"text: longer than max_prompt_chars={limit}"
            )
        self.messages_received += 1
        toks = self.m.engine.tokenizer.encode(msg.text)
        if not toks:
            return
        feed = self.text.pending + toks
        self.text.pending = []
        self.appended += len(feed)
        try:
            await self.m.scheduler.prefill(self.text, feed)
        except Exception as e:  # noqa: BLE001  (its batch failed)
            raise await self._fail(conn, "internal_error", str(e)) from None

    async def generate(self, conn: Conn, msg) -> None:
        if msg.max_new_tokens > self.st.settings.max_new_tokens:
            raise await self._fail(
                conn,
                "invalid_message",
                f"max_new_tokens: at most {self.st.settings.max_new_tokens}",
            )
        self.messages_received += 1
        params = msg.to_sampling(msg.max_new_tokens)
        prompt_tokens = self.appended + len(self.text.pending)
        self.appended = 0
        if params.max_tokens == 0:
            await self.emit(
                {
                    "type": "done",
                    "finish_reason": "length",
                    "seed": params.seed,
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0},
                }
            )
            return
        self.g = self.m.scheduler.generate(self.text, params)
        self.pump = asyncio.get_running_loop().create_task(self._pump(params, prompt_tokens))
        await self.wait_turn()

    async def _pump(self, params, prompt_tokens: int) -> None:
        """Forward one generation's events to the outbox (and the connection, if any)."""
        g = self.g
        try:
            while True:
                ev = await g.events.get()
                if ev[0] == "token":
                    await self.emit({"type": "token", "text": ev[2], "id": ev[1]})
                elif ev[0] == "done":
                    if ev[2]:
                        await self.emit({"type": "token", "text": ev[2], "id": None})
                    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": g.n_generated}
                    await self.emit(
                        {
                            "type": "done",
                            "finish_reason": ev[1],
                            "seed": params.seed,
                            "usage": usage,
                        }
                    )
                    return
                else:
                    await self._fail(self.conn, "internal_error", str(ev[1]))
                    return
        finally:
            self.g = None
            self.pump = None

    async def _fail(self, conn: Conn | None, code: str, message: str) -> Closed:
        err = Closed(code)
        if conn is not None:
            err = await conn.fail(code, message)
        await self.st.store.finish(self, code)
        return err

    def cancel_generation(self) -> None:
        if self.g is not None:
            self.m.scheduler.cancel(self.g)

    async def export(self, persist: bool = False) -> bytes:
        if self.g is not None or self.text.inflight is not None:
            raise SnapshotError("a generation or prefill is running; export between turns")
        t = self.text

        def fields() -> dict:
            logits = None
            if t.last_logits is not None:
                raw = t.last_logits.to(torch.float32).contiguous().numpy().tobytes()
                logits = base64.b64encode(raw).decode()
            return {
                "kind": "text",
                "pending": list(t.pending),
                "last_logits": logits,
                "appended": self.appended,
                "messages_received": self.messages_received,
            }

        return await self.snapshot(t.slot, fields, persist)

    @classmethod
    def from_extra(
        cls, st: ServerState, m: ModelEntry, slot: int, extra: dict, **kw: Any
    ) -> TextLive:
        vocab = m.engine.config.vocab_size
        pending = [int(x) for x in extra["pending"]]
        if len(pending) > 4096 or any(not 0 <= x < vocab for x in pending):
            raise ValueError("pending tokens out of range")
        logits = None
        if extra.get("last_logits") is not None:
            raw = base64.b64decode(extra["last_logits"], validate=True)
            if len(raw) != 4 * m.engine.config.out_dim:
                raise ValueError("last_logits has the wrong size")
            logits = torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()  # (V,)
            if not torch.isfinite(logits).all():
                raise ValueError("last_logits must be finite")
        if not pending and logits is None:
            pending = [m.engine.tokenizer.bos]
        text = TextSession(slot=slot, pending=pending, last_logits=logits)
        return cls(
            st,
            m,
            text,
            appended=max(0, int(extra.get("appended", 0))),
            messages_received=max(0, int(extra.get("messages_received", 0))),
            **kw,
        )

    async def release(self) -> None:
        self.m.scheduler.release(self.text.slot, self.text, self.g)


@router.websocket("/v1/generate/stream")
async def generate_stream(ws: WebSocket) -> None:
    conn = Conn(ws, get_state(ws))
    st = conn.st
    sess: TextLive | None = None
    try:
        await conn.admit()
        while True:
            text, data = await conn.receive()
            if data is not None:
                raise await _fail(
                    conn, sess, "invalid_message", "this endpoint takes JSON text messages"
                )
            obj = await conn.receive_json(text or "")
            if obj.get("type") == "resume":
                if sess is not None:
                    raise await _fail(
                        conn, sess, "invalid_message", "resume must open a connection"
                    )
                sess = await resume(conn, obj, "text")  # type: ignore[assignment]
                continue
            try:
                msg = _parse.validate_python(obj)
            except ValidationError as e:
                raise await _fail(conn, sess, "invalid_message", validation_message(e)[1]) from None
            if isinstance(msg, TextStart):
                if sess is not None:
                    await sess.wait_turn()
                    await st.store.finish(sess, "restarted")
                    sess = None
                sess = await _start(conn, msg)
                await conn.send(sess.ready())
                sess.conn = conn
                continue
            if sess is None:
                raise await conn.fail("no_session", f"send start before {msg.type}")
            await sess.wait_turn()
            if sess.closed or sess.conn is not conn:
                raise Closed("taken_over")
            if isinstance(msg, TextAppend):
                await sess.append(conn, msg)
            else:
                await sess.generate(conn, msg)
    except Closed as e:
        await connection_over(conn, sess, e)
        sess = None
    finally:
        await connection_over(conn, sess, None)  # cancelled (server stopping)


async def _fail(conn: Conn, sess: TextLive | None, code: str, message: str) -> Closed:
    if sess is not None:
        return await sess._fail(conn, code, message)
    return await conn.fail(code, message)


async def _start(conn: Conn, msg: TextStart) -> TextLive:
    m, slot = await open_slot(conn, msg.model, "lm")
    return register(
        conn, TextLive(conn.st, m, TextSession(slot=slot, pending=[m.engine.tokenizer.bos]))
    )  # type: ignore[return-value]
