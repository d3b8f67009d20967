"""The WebSocket session kinds: how each endpoint parses messages and builds its session."""

from __future__ import annotations

from pydantic import TypeAdapter

from ..protocol import SpeechMessage, TextMessage
from .connection import SessionKind
from .speech import SpeechSession
from .text import TextLive

SPEECH = SessionKind(
    name="speech",
    model_kind="speech",
    parse=TypeAdapter(SpeechMessage),
    create=SpeechSession.create,
    no_session="end without a started stream",
    early_binary=("no_session", "send a start message before audio"),
)
TEXT = SessionKind(
    name="text",
    model_kind="lm",
    parse=TypeAdapter(TextMessage),
    create=TextLive.create,
    no_session="send start before {type}",
    early_binary=("invalid_message", "this endpoint takes JSON text messages"),
)
CLASSES: dict[str, type[SpeechSession] | type[TextLive]] = {
    "speech": SpeechSession,
    "text": TextLive,
}
