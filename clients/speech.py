"""Speech streaming client for ``WS /v1/speech/stream`` (async).

Usage::

    async with AsyncSpeechClient("http://127.0.0.1:8000") as client:
        async for result in client.stream_file("yes.wav", realtime=True):
            print(result.label, result.score, "final" if result.is_final else "partial")

One client holds one WebSocket; each ``stream*`` call is one session on it (``start`` ...
audio ... ``end`` -> ``final``) and sessions run one after another on the same connection.
With ``continuous=True`` (keyword spotting) the session stays open over many commands: the
iterator yields a :class:`~clients.types.Detection` per spoken command as well (options:
``threshold``, ``keywords`` {command: threshold}, ``listen`` [commands], ``refractory_ms``).
Audio is sent by a task of its own while results are read, so partial results arrive as the
audio goes out. When the connection drops mid-session and the server gave a resume token, the
client reconnects, resumes the session and re-sends the audio the server had not received.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from clients._ws import ClientBase, Disconnected, Resumable, WSConnection
from clients.audio import ENCODINGS, chunk_pcm, read_audio, to_pcm_bytes
from clients.errors import ConnectionFailed, ProtocolError
from clients.types import Detection, SpeechResult

__all__ = ["AsyncSpeechClient", "SPEECH_PATH"]

SPEECH_PATH = "/v1/speech/stream"
MAX_RESEND_S = 60.0  # audio kept for re-sending after a resume (only when the server resumes)
Chunk = bytes | np.ndarray


async def _aiter(chunks: Iterable[Chunk] | AsyncIterable[Chunk]) -> AsyncIterator[Chunk]:
    if isinstance(chunks, AsyncIterable):
        async for c in chunks:
            yield c
    else:
        for c in chunks:
            yield c


class _Upload:
    """The audio of one session: what was sent, and what may have to be sent again."""

    def __init__(self, source: AsyncIterator[Chunk], encoding: str, sample_rate: int) -> None:
        self.source = source
        self.encoding = encoding
        self.bytes_per_second = sample_rate * ENCODINGS[encoding]
        self.sent = 0  # bytes sent so far (all connections together)
        self.acked = 0  # bytes the server is known to hold
        self.unacked: deque[tuple[int, bytes]] = deque()  # (offset, payload) kept for resends
        self.kept = 0  # bytes held in unacked
        self.max_kept = int(MAX_RESEND_S * self.bytes_per_second)
        self.done = False  # the source is exhausted and "end" was sent
        self.delivered_ms = -1.0  # audio_ms of the latest result given to the caller
        self.durable = False  # server checkpoints: forget audio only once a checkpoint has it

    def record(self, data: bytes, resumable: bool) -> None:
        """Count a payload as sent; keep it for a resend only while a resume is possible."""
        if resumable:
            self.unacked.append((self.sent, data))
            self.kept += len(data)
            while self.kept > self.max_kept and len(self.unacked) > 1:  # bounded memory
                self.kept -= len(self.unacked.popleft()[1])
        self.sent += len(data)

    def ack_ms(self, audio_ms: float) -> None:
        """The server reported ``audio_ms`` processed: forget payloads wholly before it
        (with durable checkpoints only a ``checkpoint`` message does that: `ack_bytes`)."""
        if self.durable:
            return
        upto = int(audio_ms / 1000.0 * self.bytes_per_second)
        upto -= upto % ENCODINGS[self.encoding]
        self._ack(upto)

    def ack_bytes(self, upto: int) -> None:
        """A stored checkpoint holds the first ``upto`` bytes."""
        self._ack(upto)

    def _ack(self, upto: int) -> None:
        self.acked = max(self.acked, min(upto, self.sent))
        while self.unacked and self.unacked[0][0] + len(self.unacked[0][1]) <= self.acked:
            self.kept -= len(self.unacked.popleft()[1])

    def resend_from(self, offset: int) -> list[bytes]:
        """Payloads to send again after a resume at byte ``offset`` (partial first one cut)."""
        if self.unacked and offset < self.unacked[0][0]:
            raise ConnectionFailed(
                f"cannot resume: the server lost audio from byte {offset}, older than the "
                f"{MAX_RESEND_S:g} s kept for resends"
            )
        out = []
        for start, data in self.unacked:
            end = start + len(data)
            if end <= offset:
                continue
            out.append(data[max(0, offset - start) :])
        return out


class AsyncSpeechClient(ClientBase):
    """Async client of the speech stream endpoint; use as an async context manager.

    Keyword arguments: those of :class:`~clients._ws.ClientBase` (model, api_key, timeouts, ...).
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self._conn: WSConnection | None = None
        self._live = Resumable(self.cfg, SPEECH_PATH)
        self.labels: list[str] = []
        self.detection: dict[str, Any] = {}  # continuous mode: the operating point in force
        self.configured_ms: float | None = None  # audio time the last `configure` applies from
        self.reconnects = 0  # resumes performed over this client's life
        self._durable = False  # the current session's server keeps durable checkpoints

    @property
    def session_id(self) -> str | None:
        """Id of the current (or last) session."""
        return self._live.session_id

    @property
    def resume_token(self) -> str | None:
        return self._live.token

    async def __aenter__(self) -> AsyncSpeechClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        if self._conn is None or not self._conn.is_open:
            self._conn = WSConnection(self.cfg, SPEECH_PATH)
            await self._conn.open()

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------ public API
    async def stream_file(
        self,
        path: str | Path,
        *,
        chunk_ms: float = 100.0,
        realtime: bool = False,
        interim_results: bool = True,
        encoding: str = "pcm_s16le",
        **listening: Any,
    ) -> AsyncIterator[SpeechResult | Detection]:
        """Stream an audio file (its own sample rate); yields partials (and detections in
        continuous mode), then the final. ``listening``: see :meth:`stream`."""
        clip = read_audio(path)
        chunks = (data for data, _ in chunk_pcm(clip, chunk_ms, encoding))
        async for r in self.stream(
            chunks,
            sample_rate=clip.sample_rate,
            encoding=encoding,
            realtime=realtime,
            interim_results=interim_results,
            **listening,
        ):
            yield r

    async def recognize_file(self, path: str | Path, **kwargs: Any) -> SpeechResult:
        """Stream a whole file and return only the final result."""
        final = None
        async for r in self.stream_file(path, interim_results=False, **kwargs):
            if isinstance(r, SpeechResult) and r.is_final:
                final = r
        if final is None:
            raise ProtocolError("the server ended the session without a final result")
        return final

    async def stream(
        self,
        chunks: Iterable[Chunk] | AsyncIterable[Chunk],
        *,
        sample_rate: int,
        encoding: str = "pcm_s16le",
        realtime: bool = False,
        interim_results: bool = True,
        continuous: bool = False,
        threshold: float | None = None,
        keywords: dict[str, float] | None = None,
        listen: list[str] | None = None,
        refractory_ms: float | None = None,
    ) -> AsyncIterator[SpeechResult | Detection]:
        """Stream PCM chunks (bytes in ``encoding``, or numpy float/int16 arrays).

        ``realtime`` paces the upload at the audio's own speed (as a microphone would); else
        chunks go out as fast as the server accepts them. Yields each partial result as it
        arrives and finally the ``final`` result, then returns. ``continuous`` asks for keyword
        spotting: a ``Detection`` per spoken command, as it is detected (the other options
        override the model's operating point; the server refuses unknown commands).
        """
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}; use one of {sorted(ENCODINGS)}")
        if int(sample_rate) <= 0:
            raise ValueError(f"sample_rate must be a positive integer, got {sample_rate}")
        upload = _Upload(_aiter(chunks), encoding, int(sample_rate))
        start = {
            "type": "start",
            "sample_rate": int(sample_rate),
            "encoding": encoding,
            "interim_results": bool(interim_results),
        }
        if continuous:
            start["mode"] = "continuous"
            opts = {"threshold": threshold, "keywords": keywords, "listen": listen}
            opts["refractory_ms"] = refractory_ms
            start.update({k: v for k, v in opts.items() if v is not None})
        if self.model:
            start["model"] = self.model
        await self.connect()
        await self._begin(start)
        upload.durable = self._durable
        t0 = time.monotonic()
        finished = False
        try:
            while True:
                sender = asyncio.create_task(self._send(upload, realtime, t0))
                try:
                    async for result in self._receive(upload, sender):
                        finished = isinstance(result, SpeechResult) and result.is_final
                        yield result
                        if finished:
                            return
                    raise ProtocolError("results ended without a final")
                except Disconnected as exc:
                    self._live.check(exc)  # raises unless the session can be resumed
                finally:
                    sender.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await sender
                await self._resume(upload)
        finally:
            if not finished:
                # left mid-session (an error, or the caller stopped iterating): the connection
                # is in an unknown state, so the next session opens a new one
                await self.close()

    async def configure(
        self,
        *,
        threshold: float | None = None,
        keywords: dict[str, float] | None = None,
        listen: list[str] | None = None,
        refractory_ms: float | None = None,
    ) -> None:
        """Change the detection options of the running continuous stream (call it while
        iterating :meth:`stream`); the server applies them from the next audio it processes
        and answers ``configured`` (kept in :attr:`detection`). A refused option ends the
        stream with a ``ServerError`` from the iteration."""
        opts = {"threshold": threshold, "keywords": keywords, "listen": listen}
        opts["refractory_ms"] = refractory_ms
        msg = {"type": "configure", **{k: v for k, v in opts.items() if v is not None}}
        if len(msg) == 1:
            raise ValueError("configure: give at least one option")
        if self._conn is None:
            raise ProtocolError("configure needs a running stream")
        await self._conn.send_json(msg)

    # ------------------------------------------------------------------ internals
    async def _begin(self, start: dict[str, Any]) -> None:
        assert self._conn is not None
        await self._conn.send_json(start)
        ready = await self._conn.recv()
        if ready.get("type") != "ready":
            raise ProtocolError(f"expected 'ready' after 'start', got {ready!r}")
        self._live.started(ready)
        self.labels = list(ready.get("labels") or [])
        self.detection = dict(ready.get("detection") or {})
        self.configured_ms = None
        self._durable = bool(ready.get("checkpoints"))

    async def _send(self, upload: _Upload, realtime: bool, t0: float) -> None:
        """Send the rest of the audio (after what was already sent), then ``end``."""
        assert self._conn is not None
        if upload.done:  # everything went out before a resume; _resume re-sent "end"
            return
        async for chunk in upload.source:
            data = to_pcm_bytes(chunk, upload.encoding)
            if not data:
                continue
            upload.record(data, resumable=bool(self.resume_token))
            await self._conn.send_bytes(data)
            if realtime:  # sleep until the wall clock catches up with the audio sent
                ahead = t0 + upload.sent / upload.bytes_per_second - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        upload.done = True
        await self._conn.send_json({"type": "end"})

    async def _receive(
        self, upload: _Upload, sender: asyncio.Task[None]
    ) -> AsyncIterator[SpeechResult | Detection]:
        assert self._conn is not None
        while True:
            recv = asyncio.create_task(self._conn.recv())
            done, _ = await asyncio.wait({recv, sender}, return_when=asyncio.FIRST_COMPLETED)
            if sender in done and recv not in done and sender.exception() is not None:
                recv.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await recv
                raise sender.exception()  # type: ignore[misc]
            if recv not in done:  # sender finished cleanly: keep reading
                await asyncio.wait({recv})
            msg = recv.result()
            kind = msg.get("type")
            if kind == "checkpoint":
                if isinstance(msg.get("bytes_received"), int):
                    upload.ack_bytes(msg["bytes_received"])
                continue
            if not self._live.fresh(msg):
                continue  # replayed after a resume, already delivered
            if kind in ("partial", "final"):
                result = SpeechResult.from_message(msg, self.session_id)
                if kind == "partial" and result.audio_ms <= upload.delivered_ms:
                    continue  # redone after a server crash: already delivered
                upload.delivered_ms = max(upload.delivered_ms, result.audio_ms)
                upload.ack_ms(result.audio_ms)
                yield result
            elif kind == "detection":
                yield Detection.from_message(msg, self.session_id)
            elif kind == "configured":
                self.detection = dict(msg.get("detection") or {})
                self.configured_ms = float(msg.get("audio_ms") or 0.0)
            elif kind in ("going_away", "ready", "ping", "pong", "warning", "info"):
                continue  # informational; ignored
            else:
                raise ProtocolError(f"unexpected message during a speech session: {msg!r}")

    async def _resume(self, upload: _Upload) -> None:
        """Reconnect and resume the live session; re-send the audio the server did not get."""
        if self._conn is not None:
            await self._conn.close()
        self._conn, ready = await self._live.resume()
        self.reconnects += 1
        offset = ready.get("bytes_received")
        if not isinstance(offset, int):  # a server that reports only the audio processed
            upload.ack_ms(float(ready.get("audio_ms") or 0.0))
            offset = upload.acked
        for data in upload.resend_from(offset):
            await self._conn.send_bytes(data)
        if upload.done and not ready.get("ended"):
            await self._conn.send_json({"type": "end"})
