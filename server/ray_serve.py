"""dlr-serve on Ray Serve: one deployment, each replica an engine with its state pool.

Each replica runs the FastAPI app of `create_app(settings)` as its ingress (HTTP, SSE and the
speech and text WebSockets pass through Ray's proxy). Ray Serve runs the app's lifespan inside
the replica (uvicorn's LifespanOn at replica start, its shutdown in the destructor), so models
load and schedulers start through the same code path as `dlr-serve`.

- Settings: `DLR_*` variables of the replica's environment (runtime_env `env_vars` in
  deploy/ray/serve.yaml), overridden by the `settings` argument of `build_app` (a dict of
  Settings fields; `serve run ... settings='{"max_sessions": 64}'` style args or the config's
  `args:`). Every replica of a deployment must point at the same state store
  (`DLR_STATE_STORE=redis://...`, with the same `DLR_STATE_SECRET`) for another replica to
  continue a session.
- Which replica answered: every HTTP response and WebSocket handshake carries
  `X-DLR-Replica: <replica id>`.
- Session affinity: with Ray's consistent-hash request router (see serve.yaml) a request whose
  `X-DLR-Session-Id` header names a session goes to the same replica while it is up (the
  header name is the cluster-wide `RAY_SERVE_SESSION_ID_HEADER_KEY`). Browsers cannot set
  WebSocket headers and a WebSocket `resume` names its session inside the stream, which the
  router never sees: those go anywhere, and the shared store makes that correct.
- Shutdown: Ray waits for ongoing requests (open WebSockets count) for up to
  `graceful_shutdown_timeout_s`, then calls the destructor; the destructor runs the server's
  drain (going_away to clients, sessions persisted with `state_dir`) before the app's lifespan
  shutdown. Past that timeout Ray kills the replica: only the store's checkpoints survive then.

Run: `serve run deploy/ray/serve.yaml` (or `serve deploy` to a running cluster);
programmatically `serve.run(build_app({...}))`.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .app import create_app
from .drain import drain
from .settings import Settings

log = logging.getLogger("dlr.server")
REPLICA_HEADER = b"x-dlr-replica"


class ReplicaHeader:
    """ASGI middleware: `X-DLR-Replica` on every HTTP response and WebSocket accept."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.value = app, replica.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(msg: Message) -> None:
            if msg["type"] in ("http.response.start", "websocket.accept"):
                msg = {**msg, "headers": [*msg.get("headers", []), (REPLICA_HEADER, self.value)]}
            await send(msg)

        await self.app(scope, receive, tagged if scope["type"] != "lifespan" else send)


def replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001  (outside a replica: e.g. built in a test)
        return "local"


def settings_of(overrides: dict[str, Any] | None) -> Settings:
    """`DLR_*` environment, then `overrides`; the port is Ray's, not the server's."""
    return Settings(**(overrides or {}))


def ingress_app(overrides: dict[str, Any] | None):
    """The app a replica serves: create_app plus the replica header."""
    app = create_app(settings_of(overrides))
    app.add_middleware(ReplicaHeader, replica=replica_id())
    return app


class _Replica:
    """`serve.ingress` needs the app when the class is defined, but settings (and the replica id)
    are only known in the replica: `__serve_build_asgi_app__` builds it there."""

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        self._overrides = settings

    def __serve_build_asgi_app__(self):
        self._app = ingress_app(self._overrides)
        return self._app


class DLRReplica(serve.ingress()(_Replica)):
    """One replica: its own engines and state pools, the FastAPI app as ingress."""

    async def __init__(self, settings: dict[str, Any] | None = None) -> None:
        await super().__init__(settings)

    async def __del__(self) -> None:
        """Drain (going_away to clients, sessions persisted), then the app's lifespan shutdown."""
        app = getattr(self, "_app", None)
        if app is not None:
            try:
                n = await drain(app.state.sessions)
                log.info("replica %s drained: %d session(s) persisted", replica_id(), n)
            except Exception:  # noqa: BLE001  (never block the shutdown itself)
                log.exception("drain failed")
        await super().__del__()


DLRDeployment = serve.deployment(
    name="dlr",
    max_ongoing_requests=256,  # WebSocket sessions are long requests: one per live session
    graceful_shutdown_wait_loop_s=1.0,
    graceful_shutdown_timeout_s=30.0,
    health_check_period_s=5.0,
)(DLRReplica)


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """Application builder for `serve run server.ray_serve:build_app` and serve.yaml.

    `args`: `{"settings": {...Settings fields...}}`.
    """
    args = dict(args or {})
    return DLRDeployment.bind(args.get("settings"))
