"""The FastAPI application: `create_app(settings)` wires the long-lived objects (context with
models and schedulers, session store, metrics) and the routes; routes reach them through the
`CtxDep` / `StoreDep` dependencies (`app.state.dlr`, `app.state.sessions`)."""

from __future__ import annotations

import asyncio
import gc
import logging
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from starlette.middleware.cors import CORSMiddleware

from dlr_runtime.engine.malloc import keep_freed_memory

from .context import AppContext
from .drain import restore_dir
from .durable import Durable
from .errors import validation_handler
from .jsonsafe import SafeJSONResponse
from .limits import ConnectionCap, RequestLimits
from .metrics import Metrics
from .registry import load_models
from .routes import generate, info, openai_text, responses, sessions, speech, text_stream
from .security import Security
from .sessions.restore import recover, superseded
from .sessions.store import SessionStore
from .settings import Settings

STATIC_DIR = Path(__file__).resolve().parent / "static"
log = logging.getLogger("dlr.server")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    if settings.keep_freed_memory:
        keep_freed_memory()
    st = AppContext(settings=settings, metrics=Metrics())
    store = SessionStore(st)
    st.metrics.watch_prefix_caches(
        lambda: {
            m.name: m.scheduler.prefix_cache.stats().as_metrics()
            for m in st.models.values()
            if m.scheduler.prefix_cache is not None
        }
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        st.durable = await Durable.open(settings, st.metrics)  # (Redis may be down: degraded)
        st.state_store = st.durable.store
        st.durable.on_written, st.durable.on_evict = store.written, store.evicted
        store.recover = partial(recover, store)
        store.superseded = partial(superseded, store)
        st.models = load_models(settings, st.metrics)
        for m in st.models.values():
            m.scheduler.start()
        restored = await restore_dir(store)
        # The startup heap (torch, the models, numba, the app: ~325k objects) is moved out of
        # the collector's reach: a full collection of it took 210-380 ms in the middle of
        # serving and stalled every stream (a gc callback during bench_stream_capacity).
        if settings.gc_freeze:
            gc.collect()
            gc.freeze()
        parker = None
        if settings.park_after_idle_s > 0:
            every = min(5.0, max(0.05, settings.park_after_idle_s / 4))
            parker = asyncio.get_running_loop().create_task(store.park_idle(every))
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
            if parker is not None:
                parker.cancel()
            for m in st.models.values():
                await m.scheduler.stop()
            await st.durable.close(settings.drain_timeout_s)

    app = FastAPI(
        title="dlr-serve",
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
    )
    app.state.dlr = st
    app.state.sessions = store
    app.add_exception_handler(RequestValidationError, validation_handler)
    for module in (info, generate, openai_text, responses, speech, text_stream, sessions):
        app.include_router(module.router)
    if STATIC_DIR.is_dir():
        app.mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="static")
    origins = settings.origin_list()
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Resume-Token"],
            expose_headers=["Retry-After", "X-Session-Kind", "X-Model"],
        )
    app.add_middleware(RequestLimits, settings=settings)  # (inside Security: keys first)
    app.add_middleware(ConnectionCap, settings=settings, gauge=st.metrics.websockets)
    app.add_middleware(Security, settings=settings)
    return app
