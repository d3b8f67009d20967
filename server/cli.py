"""`dlr-serve`: start the server. Flags override `DLR_*` environment variables.

Example: `dlr-serve --port 9000 --max-batch-size 1` or `DLR_MODELS_DIR=/models dlr-serve`.
"""

from __future__ import annotations

import argparse
import logging
from typing import get_args

import uvicorn

from .app import create_app
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
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        ws_max_size=4 * settings.max_frame_bytes,
        ws_ping_interval=20.0,
        ws_ping_timeout=60.0,
    )


if __name__ == "__main__":
    main()
