"""The FastAPI application: `create_app(settings)` wires the long-lived objects (context with
models and schedulers, session store, metrics) and the routes; routes reach them through the
`CtxDep` / `StoreDep` dependencies (`app.state.dlr`, `app.state.sessions`)."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from starlette.middleware.cors import CORSMiddleware

from .context import AppContext
from .drain import restore_dir
from .errors import validation_handler
from .jsonsafe import SafeJSONResponse
from .limits import ConnectionCap, RequestLimits
from .metrics import Metrics
from .registry import load_models
from .routes import generate, info, sessions, speech, text_stream
from .security import Security
from .sessions.store import SessionStore
from .settings import Settings

STATIC_DIR = Path(__file__).resolve().parent / "static"
log = logging.getLogger("dlr.server")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    st = AppContext(settings=settings, metrics=Metrics())
    store = SessionStore(st)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st.models = load_models(settings, st.metrics)
        for m in st.models.values():
            m.scheduler.start()
        restored = await restore_dir(store)
        st.ready = True
        log.info(
            "serving %d model(s): %s; %d session(s) restored",
            len(st.models),
            ", ".join(st.models) or "none",
            restored,
        )
        try:
            yield
        finally:
            st.ready = False
            for m in st.models.values():
                await m.scheduler.stop()

    app = FastAPI(
        title="dlr-serve",
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
    )
    app.state.dlr = st
    app.state.sessions = store
    app.add_exception_handler(RequestValidationError, validation_handler)
    for module in (info, generate, speech, text_stream, sessions):
        app.include_router(module.router)
    if STATIC_DIR.is_dir():
        app.mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="static")
    origins = settings.origin_list()
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Resume-Token"],
            expose_headers=["Retry-After", "X-Session-Kind", "X-Model"],
        )
    app.add_middleware(RequestLimits, settings=settings)  # (inside Security: keys first)
    app.add_middleware(ConnectionCap, settings=settings)
    app.add_middleware(Security, settings=settings)
    return app
