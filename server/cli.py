"""`dlr-serve`: start the server. Flags override `DLR_*` environment variables.

Example: `dlr-serve --port 9000 --max-batch-size 1` or `DLR_MODELS_DIR=/models dlr-serve`.
"""

from __future__ import annotations

import argparse
import logging
from typing import get_args

import uvicorn

from .app import create_app
from .drain import DrainingServer
from .settings import Settings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlr-serve", description=__doc__.splitlines()[0])
    for name, f in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind = f.annotation
        choices = get_args(kind) if getattr(kind, "__origin__", None) is not None else None
        typ = kind if kind in (int, float) else str
        p.add_argument(
            flag,
            dest=name,
            type=typ,
            default=None,
            choices=choices or None,
            help=f"{f.description} (default: {f.default}; env DLR_{name.upper()})",
        )
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    settings = Settings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    app = create_app(settings)
    config = uvicorn_config(app, settings)
    DrainingServer(config, app.state.dlr).run()


def uvicorn_config(app, settings: Settings, **kw) -> uvicorn.Config:
    """uvicorn settings of the server: frame size, keepalive pings, limits."""
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
        lifespan="on",
    )
    base.update(kw)
    return uvicorn.Config(app, **base)


if __name__ == "__main__":
    main()
