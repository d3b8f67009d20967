"""Python client of dlr-serve: speech streaming, text generation and chat sessions.

Async clients: :class:`AsyncSpeechClient`, :class:`AsyncGenerateClient`,
:class:`AsyncChatSession`; their synchronous twins: :class:`SpeechClient`,
:class:`GenerateClient`, :class:`ChatSession`. The command line is ``dlr-client``
(:mod:`clients.cli`). This package needs only httpx, websockets and numpy (soundfile for
non-WAV files): it imports no torch and nothing of the server.
"""

from clients.chat import AsyncChatSession
from clients.errors import (
    ClientError,
    ConnectionFailed,
    Overloaded,
    ProtocolError,
    ServerError,
    Timeout,
)
from clients.generate import AsyncGenerateClient
from clients.speech import AsyncSpeechClient
from clients.sync import ChatSession, GenerateClient, SpeechClient
from clients.types import (
    Detection,
    GenerateResult,
    ModelInfo,
    Score,
    SpeechResult,
    TokenEvent,
    Usage,
)

__all__ = [
    "AsyncChatSession",
    "AsyncGenerateClient",
    "AsyncSpeechClient",
    "ChatSession",
    "ClientError",
    "ConnectionFailed",
    "Detection",
    "GenerateClient",
    "GenerateResult",
    "ModelInfo",
    "Overloaded",
    "ProtocolError",
    "Score",
    "ServerError",
    "SpeechClient",
    "SpeechResult",
    "Timeout",
    "TokenEvent",
    "Usage",
]
