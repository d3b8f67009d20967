"""Typed results returned by the client library, parsed from the server's JSON messages.

Parsing is tolerant of extra fields (kept in ``raw``) so a newer server does not break an older
client, but strict about the fields each type needs: a message missing them is a
:class:`~clients.errors.ProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clients.errors import ProtocolError

__all__ = [
    "Detection",
    "GenerateResult",
    "ModelInfo",
    "Score",
    "SpeechResult",
    "TokenEvent",
    "Usage",
]


def _need(msg: dict[str, Any], key: str, kind: str) -> Any:
    if key not in msg:
        raise ProtocolError(f"{kind} message without {key!r}: {msg!r}")
    return msg[key]


@dataclass(frozen=True)
class Score:
    """One class and its score."""

    label: str
    score: float


@dataclass(frozen=True)
class SpeechResult:
    """A partial or final classification of the audio streamed so far.

    ``audio_ms`` is how much audio (in milliseconds at the sent rate) the result covers;
    ``top`` lists the best classes, best first.
    """

    is_final: bool
    label: str
    score: float
    audio_ms: float
    top: list[Score] = field(default_factory=list)
    session_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    vad: str | None = None  # continuous mode: "speech" | "silence"
    detections: list[Detection] = field(default_factory=list)  # continuous final: all of them

    @classmethod
    def from_message(cls, msg: dict[str, Any], session_id: str | None = None) -> SpeechResult:
        kind = str(msg.get("type"))
        top = [Score(str(t["label"]), float(t["score"])) for t in msg.get("top") or []]
        dets = [Detection.from_message(d, session_id) for d in msg.get("detections") or []]
        return cls(
            is_final=kind == "final",
            label=str(_need(msg, "label", kind)),
            score=float(_need(msg, "score", kind)),
            audio_ms=float(msg.get("audio_ms", 0.0)),
            top=top,
            session_id=session_id,
            raw=msg,
            vad=msg.get("vad"),
            detections=dets,
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-able data (what ``dlr-client speech --json`` prints)."""
        return {
            "type": "final" if self.is_final else "partial",
            "label": self.label,
            "score": self.score,
            "audio_ms": self.audio_ms,
            "top": [{"label": t.label, "score": t.score} for t in self.top],
            **({"vad": self.vad} if self.vad else {}),
            **({"detections": [d.to_dict() for d in self.detections]} if self.is_final else {}),
        }


@dataclass(frozen=True)
class Detection:
    """One spoken command detected in a continuous stream (``"mode": "continuous"``).

    ``start_ms`` / ``end_ms``: where the evidence for it began and when it fired, in
    milliseconds of the stream; ``index``: its number in the stream (1, 2, ...).
    """

    label: str
    score: float
    start_ms: float
    end_ms: float
    index: int = 0
    session_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_message(cls, msg: dict[str, Any], session_id: str | None = None) -> Detection:
        return cls(
            label=str(_need(msg, "label", "detection")),
            score=float(_need(msg, "score", "detection")),
            start_ms=float(_need(msg, "start_ms", "detection")),
            end_ms=float(_need(msg, "end_ms", "detection")),
            index=int(msg.get("index", 0)),
            session_id=session_id,
            raw=msg,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "detection",
            "index": self.index,
            "label": self.label,
            "score": self.score,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
        }


@dataclass(frozen=True)
class Usage:
    """Token counts of one generation."""

    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Usage | None:
        if not isinstance(d, dict):
            return None
        return cls(int(d.get("prompt_tokens", 0)), int(d.get("completion_tokens", 0)))


@dataclass(frozen=True)
class TokenEvent:
    """One streamed piece of generated text; the last event has ``finish_reason`` (and usage)."""

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_last(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> TokenEvent:
        text = msg.get("text")
        if text is None:
            token = msg.get("token")
            text = token.get("text", "") if isinstance(token, dict) else (token or "")
        return cls(
            text=str(text),
            finish_reason=msg.get("finish_reason"),
            usage=Usage.from_dict(msg.get("usage")),
            raw=msg,
        )


@dataclass(frozen=True)
class GenerateResult:
    """A whole generation: the text, why it stopped, and token counts."""

    text: str
    finish_reason: str
    usage: Usage | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> GenerateResult:
        return cls(
            text=str(_need(msg, "text", "generate")),
            finish_reason=str(_need(msg, "finish_reason", "generate")),
            usage=Usage.from_dict(msg.get("usage")),
            raw=msg,
        )


@dataclass(frozen=True)
class ModelInfo:
    """One served model as ``GET /v1/models`` describes it."""

    name: str
    kind: str
    labels: list[str] | None = None
    vocab_size: int | None = None
    sample_rate: int | None = None
    state_bytes_per_session: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelInfo:
        name = d.get("name", d.get("id"))
        if name is None:
            raise ProtocolError(f"model entry without a name: {d!r}")
        vocab = d.get("vocab_size", d.get("vocab"))
        if isinstance(vocab, dict):
            vocab = vocab.get("vocab_size", vocab.get("size"))
        return cls(
            name=str(name),
            kind=str(d.get("kind", "")),
            labels=list(d["labels"]) if d.get("labels") else None,
            vocab_size=int(vocab) if isinstance(vocab, int) else None,
            sample_rate=d.get("sample_rate"),
            state_bytes_per_session=d.get("state_bytes_per_session", d.get("state_bytes")),
            raw=d,
        )
