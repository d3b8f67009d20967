"""`WS /v1/speech/stream`: streaming speech-command classification.

Protocol: client `{"type":"start","sample_rate","encoding","model","interim_results"}` ->
server `{"type":"ready","session_id","resume_token","model","labels","sample_rate"}`; then
binary frames of mono PCM (pcm_s16le or pcm_f32le) at the client's rate, resampled statefully
to the model's rate; the server sends `{"type":"partial","audio_ms","lag_ms","label","score",
"top","seq"}` at most every `partial_interval_ms` (`lag_ms`: audio received but not yet
processed); client `{"type":"end"}` -> `{"type":"final",...}` (same fields). Another `start`
may follow on the same connection. Errors: `{"type":"error","code","message"}` + close.

Resume (see server/sessions/store.py): after a dropped connection, `{"type":"resume","session_id",
"resume_token","last_seq"?}` on a new connection -> `ready` with `"resumed": true`,
`bytes_received` (audio bytes the server accepted: re-send from there), `audio_ms` (processed)
and `ended`; audio accepted before the drop is processed while detached, missed partials are
re-sent from the outbox (up to `resume_buffer_messages`) and the final always covers all of it.

Backpressure: when more than `backpressure_audio_s` of audio waits, the server stops reading
the socket until it falls below (TCP slows the client); after `backpressure_timeout_s`, or
beyond `max_queued_audio_s`, the session is closed with `queue_full` (1013).
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from ..sessions.connection import serve
from ..sessions.kinds import SPEECH
from ..sessions.store import StoreDep

router = APIRouter()


@router.websocket("/v1/speech/stream")
async def speech_stream(ws: WebSocket, store: StoreDep) -> None:
    await serve(ws, store, SPEECH)
