"""The JSON encoding boundary: the server never writes `NaN` or `Infinity` (not JSON; a
browser's `JSON.parse` refuses them).

`dumps(obj)` encodes strictly (`allow_nan=False`); only if that fails are non-finite floats
replaced by `null` (logged once per call site kind, counted by the caller if it wants).
`SafeJSONResponse` is the application's default response class; WebSocket messages
(server/ws.py) and SSE events go through `dumps` too. The sources of non-finite numbers are
fixed where they arise (e.g. PCM samples are clamped at decode); this is the guard behind them.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi.responses import JSONResponse

log = logging.getLogger("dlr.server")


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None (containers copied)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        log.warning("a non-finite number in an outgoing message was replaced by null")
        return json.dumps(finite(obj), allow_nan=False, **kw)


class SafeJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
