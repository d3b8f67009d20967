"""`dlr-serve`: start the server. Flags override `DLR_*` environment variables.

Example: `dlr-serve --port 9000 --max-batch-size 1` or `DLR_MODELS_DIR=/models dlr-serve`.
"""

from __future__ import annotations

import logging
import socket
import sys

import uvicorn
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from . import workers
from .app import create_app
from .drain import DrainingServer
from .http_deadline import deadline_protocol
from .settings import Settings


class CliSettings(Settings):
    """`Settings` that also read `dlr-serve` flags (pydantic-settings' CLI source: one
    `--kebab-case` flag per field, overriding the `DLR_*` environment)."""

    model_config = SettingsConfigDict(
        env_prefix="DLR_",
        extra="ignore",
        cli_kebab_case=True,
        cli_prog_name="dlr-serve",
        cli_implicit_flags=False,
    )


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Settings from flags (`argv`, default sys.argv) over `DLR_*` variables; a bad value
    exits with status 2 and the field's error, like any other bad flag."""
    try:
        return CliSettings(_cli_parse_args=sys.argv[1:] if argv is None else argv)
    except ValidationError as e:
        print(f"dlr-serve: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if settings.workers == 1:
        serve(settings)
        return
    try:
        workers.check(settings)
    except ValueError as e:
        print(f"dlr-serve: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(workers.run(settings, serve))


def serve(settings: Settings, sockets: list[socket.socket] | None = None) -> None:
    """Run one server process until SIGTERM (on `sockets` when given, else host:port)."""
    app = create_app(settings)
    config = uvicorn_config(app, settings)
    DrainingServer(config, app.state.sessions).run(sockets=sockets)


def uvicorn_config(app, settings: Settings, **kw) -> uvicorn.Config:
    """uvicorn settings of the server: frame size, keepalive pings, limits, read deadlines
    (headers: `header_timeout_s`, idle keep-alive: `keep_alive_s`; bodies: server/limits.py)."""
    base = dict(
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        ws_max_size=4 * settings.max_frame_bytes,
        ws_max_queue=8,  # frames buffered per socket while a session is held back
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=settings.ws_ping_timeout_s,
        ws_per_message_deflate=settings.ws_compression,
        timeout_graceful_shutdown=settings.drain_timeout_s + 5,
        http=deadline_protocol(settings.header_timeout_s),
        timeout_keep_alive=settings.keep_alive_s,
        h11_max_incomplete_event_size=64 * 1024,  # (headers; the httptools parser caps its own)
        lifespan="on",
    )
    base.update(kw)
    return uvicorn.Config(app, **base)


if __name__ == "__main__":
    main()
