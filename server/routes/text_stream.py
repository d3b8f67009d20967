"""`WS /v1/generate/stream`: a persistent text session whose state carries the conversation.

Client `{"type":"start","model"}` -> `{"type":"ready","session_id","resume_token","model"}`;
`{"type":"append","text"}` prefills the text into the state (no reply);
`{"type":"generate", max_new_tokens, temperature, top_k, top_p, seed, stop}` streams
`{"type":"token","text","id","seq"}` messages then `{"type":"done","finish_reason","usage",
"seed","seq"}`. Generated tokens stay in the state, so each turn costs only its own new tokens.

Resume (see server/sessions/store.py): a generation keeps running when the connection drops; its
tokens wait in the outbox and are re-sent after `resume` (`ready` carries `messages_received`,
the number of append/generate messages the server accepted: re-send the ones after it).
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from ..sessions.connection import serve
from ..sessions.kinds import TEXT
from ..sessions.store import StoreDep

router = APIRouter()


@router.websocket("/v1/generate/stream")
async def generate_stream(ws: WebSocket, store: StoreDep) -> None:
    await serve(ws, store, TEXT)
