"""Text a client sends must be real Unicode: JSON allows escapes of lone UTF-16 surrogates
(`"\\ud800"`), which decode to Python strings that no UTF-8 encoder (tokenizer, log, response)
accepts. Every JSON request body (server/limits.py) and every WebSocket JSON message
(server/ws.py) is checked here once, at the boundary, so no text field can carry one.

- `may_hold_surrogates(raw)`: a cheap pre-check on the raw JSON bytes (a `\\uD800`..`\\uDFFF`
  escape somewhere); only then is the parsed object walked.
- `surrogate_path(obj)`: the dotted path of the first string (value or key) holding a lone
  surrogate, e.g. `"messages.0.content"`, or None.
"""

from __future__ import annotations

import re
from typing import Any

_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE = re.compile("[\ud800-\udfff]")  # (a valid pair decodes to one code point above U+FFFF)


def may_hold_surrogates(raw: bytes | str) -> bool:
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    return _ESCAPE.search(data) is not None


def has_surrogate(s: str) -> bool:
    return _LONE.search(s) is not None


def surrogate_path(obj: Any, path: str = "") -> str | None:
    """Dotted path of the first string in `obj` holding a lone surrogate (None: clean)."""
    stack: list[tuple[Any, str]] = [(obj, path)]
    while stack:  # (iterative: depth is bounded by the JSON parser, not by this walk)
        o, p = stack.pop()
        if isinstance(o, str):
            if has_surrogate(o):
                return p or "body"
        elif isinstance(o, dict):
            items = list(o.items())
            for k, v in reversed(items):
                name = f"{p}.{k}" if p else str(k)
                if isinstance(k, str) and has_surrogate(k):
                    return p or "body"
                stack.append((v, name))
        elif isinstance(o, list):
            stack.extend((v, f"{p}.{i}" if p else str(i)) for i, v in reversed(list(enumerate(o))))
    return None


def surrogate_message(path: str) -> str:
    return f"{path}: contains a lone UTF-16 surrogate (not valid Unicode text)"
