"""The application context: settings, metrics, models and session counts of one app.

Built once by `create_app` and reached by routes through `CtxDep`. It holds no session objects
(those live in the `SessionStore`, see server/sessions/store.py), so every layer below the
routes can import it without a circle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from .durable import Durable
from .errors import NoModelError
from .metrics import Metrics
from .registry import ModelEntry
from .settings import Settings
from .store import StateStore

session_log = logging.getLogger("dlr.session")


@dataclass
class AppContext:
    settings: Settings
    metrics: Metrics
    models: dict[str, ModelEntry] = field(default_factory=dict)
    sessions: int = 0  # open sessions of every kind and model (each model counts its own)
    ready: bool = False
    draining: bool = False  # SIGTERM received: no new sessions, live ones are persisted
    # set by the drain once in-flight work is done: a session's next client message is held,
    # not handled (its resume position says it was not taken), until `drained` is set
    quiesced: bool = False
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # every client told
    state_store: StateStore | None = None  # DLR_STATE_STORE, opened at start-up
    durable: Durable | None = None  # checkpoints, parked tier, signer (server/durable.py)

    def pick_model(self, name: str | None, kind: str) -> ModelEntry:
        """The named model (checked to be of `kind`), or the first model of that kind."""
        if name is None:
            for m in self.models.values():
                if m.kind == kind:
                    return m
            raise NoModelError(f"no {kind} model is loaded")
        m = self.models.get(name)
        if m is None:
            raise NoModelError(f"model {name!r} does not exist")
        if m.kind != kind:
            raise NoModelError(f"model {name!r} is a {m.kind} model, not a {kind} model")
        return m

    def queue_overload(self) -> str:
        """Why new work is refused now ('' when it is not): too much queued work."""
        s = self.settings
        audio = sum(m.scheduler.queued_audio_s() for m in self.models.values())
        if audio > s.max_total_queued_audio_s:
            return (
                f"{audio:.1f} s of audio is waiting server-wide "
                f"(max_total_queued_audio_s={s.max_total_queued_audio_s:g})"
            )
        for m in self.models.values():
            n = m.scheduler.queued_requests()
            if n >= s.max_queued_requests:
                return f"{n} requests are waiting for model {m.name!r} (max_queued_requests)"
        return ""

    def session_started(
        self, model: ModelEntry, kind: str, sid: str | None = None
    ) -> tuple[str, float]:
        sid = sid or uuid.uuid4().hex
        self.sessions += 1
        model.sessions += 1
        self.metrics.active_sessions.labels(model.name, kind).inc()
        session_log.info(
            json.dumps(
                {"event": "session_start", "session_id": sid, "model": model.name, "kind": kind}
            )
        )
        return sid, time.perf_counter()

    def session_ended(
        self, sid: str, model: ModelEntry, kind: str, started: float, reason: str, **extra
    ) -> None:
        self.sessions -= 1
        model.sessions -= 1
        self.metrics.active_sessions.labels(model.name, kind).dec()
        session_log.info(
            json.dumps(
                {
                    "event": "session_end",
                    "session_id": sid,
                    "model": model.name,
                    "kind": kind,
                    "duration_s": round(time.perf_counter() - started, 4),
                    "reason": reason,
                    **extra,
                }
            )
        )


def get_ctx(conn: HTTPConnection) -> AppContext:
    return conn.app.state.dlr


CtxDep = Annotated[AppContext, Depends(get_ctx)]
