"""Chat messages -> prompt tokens, with the template stored in the checkpoint's metadata.

A checkpoint's `metadata.chat_template` describes a plain role-prefixed template (the shipped
byte LM carries one; a checkpoint without it gets `DEFAULT_TEMPLATE`):

    {"type": "role-prefixed",
     "roles": {"system": "System: ", "user": "User: ", "assistant": "Assistant: "},
     "message_end": "\\n",
     "stop": ["\\nUser:", "\\nSystem:"]}

A conversation renders as  bos, then for each message  roles[role] + content + message_end,
then (for generation) roles["assistant"]; generation stops at any of `stop` (added to the
request's own stop strings). Each piece is encoded on its own, so the token offset at the end of
every message is exact: `RenderedChat.boundaries` lists them, and the prefix cache inserts a
state at each, so a shared system prompt and a conversation's history hit at any length.

`render(..., continuation=True)` renders only new messages after an assistant reply that was
generated (no bos; it first closes the open assistant turn with message_end), so
render(history) == render(first turn) + reply tokens + render(next turn, continuation=True)
token for token: a stored state continues a conversation without re-reading it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlr_runtime.engine import ByteTokenizer

ROLES = ("system", "user", "assistant")
DEFAULT_TEMPLATE: dict[str, Any] = {
    "type": "role-prefixed",
    "roles": {"system": "System: ", "user": "User: ", "assistant": "Assistant: "},
    "message_end": "\n",
    "stop": ["\nUser:", "\nSystem:"],
}


@dataclass(frozen=True)
class Message:
    """One chat message in engine-facing form (content already flattened to text)."""

    role: str  # one of ROLES ("developer" is mapped to "system" at the API boundary)
    content: str


@dataclass
class RenderedChat:
    tokens: list[int]  # prompt token ids (bos first unless a continuation)
    boundaries: list[int] = field(default_factory=list)  # token offset after each message
    text: str = ""  # the rendered text (without bos), for echo and debugging


@dataclass(frozen=True)
class ChatTemplate:
    roles: Mapping[str, str]  # role -> text put before the message's content
    message_end: str  # text put after every message's content
    stop: tuple[str, ...]  # stop strings that end an assistant reply

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any] | None) -> ChatTemplate:
        """The template of a checkpoint (ValueError when it is malformed)."""
        spec = (metadata or {}).get("chat_template", DEFAULT_TEMPLATE)
        if not isinstance(spec, Mapping) or spec.get("type") != "role-prefixed":
            raise ValueError(f"unsupported chat_template {spec!r}; expected type 'role-prefixed'")
        roles = spec.get("roles")
        if not isinstance(roles, Mapping) or set(roles) != set(ROLES):
            raise ValueError(f"chat_template roles must define exactly {list(ROLES)}")
        if not all(isinstance(v, str) for v in roles.values()):
            raise ValueError("chat_template role prefixes must be strings")
        end, stop = spec.get("message_end", "\n"), spec.get("stop", [])
        if not isinstance(end, str) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError("chat_template message_end and stop must be strings")
        return cls(roles=dict(roles), message_end=end, stop=tuple(stop))

    def render(
        self,
        messages: Sequence[Message],
        tokenizer: ByteTokenizer,
        add_generation_prompt: bool = True,
        continuation: bool = False,
    ) -> RenderedChat:
        """Tokens of `messages` (+ the assistant prefix), with the offset after each message."""
        out = RenderedChat(tokens=[] if continuation else [tokenizer.bos])
        if continuation:
            self._add(out, self.message_end, tokenizer)
        for m in messages:
            if m.role not in self.roles:
                raise ValueError(f"unknown message role {m.role!r}; expected one of {list(ROLES)}")
            for piece in (self.roles[m.role], m.content, self.message_end):
                self._add(out, piece, tokenizer)
            out.boundaries.append(len(out.tokens))
        if add_generation_prompt:
            self._add(out, self.roles["assistant"], tokenizer)
        return out

    @staticmethod
    def _add(out: RenderedChat, piece: str, tokenizer: ByteTokenizer) -> None:
        out.tokens.extend(tokenizer.encode(piece))
        out.text += piece
