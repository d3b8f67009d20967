"""Synchronous clients: the async ones driven from a private event-loop thread.

``SpeechClient``, ``GenerateClient`` and ``ChatSession`` have the same methods as their async
twins (``AsyncSpeechClient`` ...), returning values instead of coroutines and plain iterators
instead of async iterators::

    with SpeechClient("http://127.0.0.1:8000") as client:
        for result in client.stream_file("yes.wav"):
            print(result)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from clients._sync import LoopThread
from clients.chat import AsyncChatSession
from clients.generate import AsyncGenerateClient
from clients.speech import AsyncSpeechClient, Chunk
from clients.types import GenerateResult, ModelInfo, SpeechResult, TokenEvent

__all__ = ["ChatSession", "GenerateClient", "SpeechClient"]


class _SyncBase:
    def __init__(self) -> None:
        self._loop = LoopThread()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _aclose(self) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        if not self._loop.closed:
            self._loop.run(self._aclose())
            self._loop.close()


class SpeechClient(_SyncBase):
    """Synchronous speech stream client (see :class:`~clients.speech.AsyncSpeechClient`)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kwargs: Any) -> None:
        super().__init__()
        self._async = AsyncSpeechClient(base_url, **kwargs)

    def _aclose(self) -> Any:
        return self._async.close()

    @property
    def session_id(self) -> str | None:
        return self._async.session_id

    @property
    def labels(self) -> list[str]:
        return self._async.labels

    @property
    def detection(self) -> dict[str, Any]:
        return self._async.detection

    @property
    def configured_ms(self) -> float | None:
        return self._async.configured_ms

    def configure(self, **options: Any) -> None:
        """Change the running continuous stream's detection options (while iterating)."""
        self._loop.run(self._async.configure(**options))

    def stream_file(self, path: str | Path, **kwargs: Any) -> Iterator[SpeechResult]:
        return self._loop.iterate(self._async.stream_file(path, **kwargs))

    def stream(self, chunks: Iterable[Chunk], **kwargs: Any) -> Iterator[SpeechResult]:
        return self._loop.iterate(self._async.stream(chunks, **kwargs))

    def recognize_file(self, path: str | Path, **kwargs: Any) -> SpeechResult:
        return self._loop.run(self._async.recognize_file(path, **kwargs))


class GenerateClient(_SyncBase):
    """Synchronous HTTP client (see :class:`~clients.generate.AsyncGenerateClient`)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kwargs: Any) -> None:
        super().__init__()
        self._async = self._loop.run(_make(AsyncGenerateClient, base_url, kwargs))

    def _aclose(self) -> Any:
        return self._async.close()

    def health(self) -> bool:
        return self._loop.run(self._async.health())

    def ready(self) -> bool:
        return self._loop.run(self._async.ready())

    def models(self) -> list[ModelInfo]:
        return self._loop.run(self._async.models())

    def generate(self, prompt: str, **params: Any) -> GenerateResult:
        return self._loop.run(self._async.generate(prompt, **params))

    def generate_stream(self, prompt: str, **params: Any) -> Iterator[TokenEvent]:
        return self._loop.iterate(self._async.generate_stream(prompt, **params))


class ChatSession(_SyncBase):
    """Synchronous persistent text session (see :class:`~clients.chat.AsyncChatSession`).

    The session is opened by the constructor and closed by ``close()`` / ``with``.
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kwargs: Any) -> None:
        super().__init__()
        self._async = AsyncChatSession(base_url, **kwargs)
        try:
            self._loop.run(self._async.open())
        except BaseException:
            self._loop.close()
            raise

    def _aclose(self) -> Any:
        return self._async.close()

    @property
    def session_id(self) -> str | None:
        return self._async.session_id

    def append(self, text: str) -> None:
        self._loop.run(self._async.append(text))

    def generate(self, **params: Any) -> Iterator[TokenEvent]:
        return self._loop.iterate(self._async.generate(**params))

    def say(self, text: str, **params: Any) -> GenerateResult:
        return self._loop.run(self._async.say(text, **params))


async def _make(cls: type, base_url: str, kwargs: dict[str, Any]) -> Any:
    """Construct on the loop thread (httpx.AsyncClient binds to the running loop lazily)."""
    return cls(base_url, **kwargs)
