"""Health, readiness, Prometheus metrics and the model list."""

from __future__ import annotations

import os

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..context import CtxDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict:
    """Liveness; `pid` tells the server processes apart (DLR_WORKERS > 1 share one port)."""
    return {"status": "ok", "pid": os.getpid()}


@router.get("/readyz")
async def readyz(st: CtxDep) -> JSONResponse:
    """200 while new work is taken, 503 while starting or draining. A failing state store
    does not make the server unready (live sessions and requests that need no store keep
    working): `degraded` is true and `degraded_reason` says why."""
    body = {
        "ready": st.ready,
        "models": sorted(st.models),
        "sessions": st.sessions,
        "max_sessions": st.settings.max_sessions,
        **(st.durable.readiness() if st.durable is not None else {}),
    }
    return JSONResponse(body, status_code=200 if st.ready else 503)


@router.get("/metrics")
async def metrics(st: CtxDep) -> Response:
    for m in st.models.values():
        st.metrics.queue_depth.labels(m.name).set(m.scheduler.queue_depth())
        st.metrics.slots_in_use.labels(m.name).set(m.engine.pool.in_use)
    if st.durable is not None:
        await st.durable.update_metrics()
    return Response(st.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def list_models(st: CtxDep) -> dict:
    return {"object": "list", "data": [m.info(st.settings) for m in st.models.values()]}
