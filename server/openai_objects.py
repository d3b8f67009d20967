"""Response objects of the OpenAI-compatible API, in the shapes the `openai` client parses.

- chat completions: `ChatCompletion` (object "chat.completion"), streamed as
  `ChatCompletionChunk`s (object "chat.completion.chunk"; with stream_options.include_usage a
  last chunk with `choices: []` and the usage), then `data: [DONE]`;
- completions: `Completion` (object "text_completion") with the legacy logprobs layout;
- responses: `ResponseObject` (object "response"), `ResponseDeleted`, and the stream events
  made by `ResponseStream` (response.created, response.in_progress, response.output_item.added,
  response.content_part.added, response.output_text.delta ..., response.output_text.done,
  response.content_part.done, response.output_item.done, response.completed), each with its
  `sequence_number`.

Usage reports prompt tokens served from the prefix cache as OpenAI does:
`usage.prompt_tokens_details.cached_tokens` (chat/completions) and
`usage.input_tokens_details.cached_tokens` (responses).

Byte tokens in logprobs: a printable byte is its character; any other byte is written
"bytes:\\xNN" (OpenAI's form for partial UTF-8), with `bytes` always the raw byte; special ids
(bos, eos) are "<bos>" / "<eos>" with `bytes: null`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from dlr_runtime.engine import ByteTokenizer

FinishReason = Literal["stop", "length"]


def new_id(prefix: str, sep: str = "-") -> str:
    """An OpenAI-style object id ("chatcmpl-...", "cmpl-...", "resp_...")."""
    return f"{prefix}{sep}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


# ---------------------------------------------------------------- logprobs
def token_text(tokenizer: ByteTokenizer, token: int) -> tuple[str, list[int] | None]:
    """A token id as logprobs show it: (text, raw bytes)."""
    if token == tokenizer.bos:
        return "<bos>", None
    if token == tokenizer.eos or not 0 <= token < 256:
        return "<eos>" if token == tokenizer.eos else f"<{token}>", None
    ch = chr(token)
    printable = token < 128 and (ch.isprintable() or ch in "\n\t")
    return (ch if printable else f"bytes:\\x{token:02x}"), [token]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


def token_logprob(
    tokenizer: ByteTokenizer, token: int, logprob: float, top: Sequence[tuple[int, float]]
) -> TokenLogprob:
    """One generated token's entry of chat logprobs; `top` as (id, logprob), most likely first."""
    text, raw = token_text(tokenizer, token)
    tops = []
    for t, lp in top:
        tt, tb = token_text(tokenizer, t)
        tops.append(TopLogprob(token=tt, logprob=lp, bytes=tb))
    return TokenLogprob(token=text, logprob=logprob, bytes=raw, top_logprobs=tops)


# ---------------------------------------------------------------- usage
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose state came from the prefix cache


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = Field(
        default_factory=CompletionTokensDetails
    )

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int = 0) -> Usage:
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )


# ---------------------------------------------------------------- chat completions
class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class _Envelope(BaseModel):
    """Fields every completion-family object carries."""

    created: int = Field(default_factory=now)
    model: str
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ChatCompletion(_Envelope):
    id: str = Field(default_factory=lambda: new_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_Envelope):
    """One streamed piece; `usage` is set only on the final usage chunk (choices empty)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice]


# ---------------------------------------------------------------- completions
class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)

    def add(
        self,
        tokenizer: ByteTokenizer,
        token: int,
        logprob: float | None,
        top: Sequence[tuple[int, float]] | None,
        offset: int,
    ) -> None:
        """Append one token (logprob None for the first echoed prompt token, as OpenAI)."""
        self.tokens.append(token_text(tokenizer, token)[0])
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(
            None if top is None else {token_text(tokenizer, t)[0]: lp for t, lp in top}
        )
        self.text_offset.append(offset)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(_Envelope):
    id: str = Field(default_factory=lambda: new_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


# ---------------------------------------------------------------- responses
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # input tokens served from a stored state or the prefix cache
    cache_write_tokens: int = 0  # input tokens whose state this turn stored


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(
        cls, input_tokens: int, output_tokens: int, cached: int = 0, written: int = 0
    ) -> ResponseUsage:
        return cls(
            input_tokens=input_tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=cached, cache_write_tokens=written
            ),
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
        )


class ResponseObject(BaseModel):
    id: str = Field(default_factory=lambda: new_id("resp", "_"))
    object: Literal["response"] = "response"
    created_at: float = Field(default_factory=lambda: float(now()))
    status: Literal["completed", "incomplete", "in_progress", "failed"] = "completed"
    model: str
    output: list[OutputMessage] = Field(default_factory=list)
    output_text: str | None = None
    parallel_tool_calls: bool = False
    tool_choice: Literal["none", "auto"] = "none"
    tools: list[Any] = Field(default_factory=list)
    previous_response_id: str | None = None
    store: bool = True
    instructions: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    incomplete_details: dict[str, str] | None = None  # {"reason": "max_output_tokens"}
    error: dict[str, str] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    usage: ResponseUsage | None = None

    def set_text(self, text: str, finish: FinishReason) -> None:
        """Put the generated text in place and mark how the turn ended."""
        status = "completed" if finish == "stop" else "incomplete"
        self.output = [OutputMessage(status=status, content=[OutputText(text=text)])]
        self.output_text = text
        self.status = status
        self.incomplete_details = None if finish == "stop" else {"reason": "max_output_tokens"}


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


# ---------------------------------------------------------------- response stream events
class ResponseLifecycleEvent(BaseModel):
    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete"
    ]
    sequence_number: int
    response: ResponseObject


class OutputItemEvent(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int = 0
    item: OutputMessage


class ContentPartEvent(BaseModel):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    part: OutputText


class TextDeltaEvent(BaseModel):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class TextDoneEvent(BaseModel):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int = 0
    content_index: int = 0
    text: str
    logprobs: list[Any] = Field(default_factory=list)


ResponseEvent = (
    ResponseLifecycleEvent | OutputItemEvent | ContentPartEvent | TextDeltaEvent | TextDoneEvent
)


class ResponseStream:
    """Makes the events of one streamed response, numbering them in order."""

    def __init__(self, response: ResponseObject) -> None:
        self.response = response.model_copy(update={"status": "in_progress"})
        self.item = OutputMessage(status="in_progress")
        self._seq = 0
        self._text = ""

    def _n(self) -> int:
        self._seq += 1
        return self._seq - 1

    def opening(self) -> list[ResponseEvent]:
        r, it = self.response, self.item
        return [
            ResponseLifecycleEvent(type="response.created", sequence_number=self._n(), response=r),
            ResponseLifecycleEvent(
                type="response.in_progress", sequence_number=self._n(), response=r
            ),
            OutputItemEvent(type="response.output_item.added", sequence_number=self._n(), item=it),
            ContentPartEvent(
                type="response.content_part.added",
                sequence_number=self._n(),
                item_id=it.id,
                part=OutputText(text=""),
            ),
        ]

    def delta(self, text: str) -> TextDeltaEvent:
        self._text += text
        return TextDeltaEvent(sequence_number=self._n(), item_id=self.item.id, delta=text)

    def closing(self, final: ResponseObject) -> list[ResponseEvent]:
        """Events after the last delta; `final` is the finished response (set_text done)."""
        part = OutputText(text=self._text)
        item = final.output[0].model_copy(update={"id": self.item.id}) if final.output else None
        final = final.model_copy(update={"output": [item] if item else []})
        kind = "response.completed" if final.status == "completed" else "response.incomplete"
        done_item = item or self.item.model_copy(update={"status": "completed", "content": [part]})
        return [
            TextDoneEvent(sequence_number=self._n(), item_id=self.item.id, text=self._text),
            ContentPartEvent(
                type="response.content_part.done",
                sequence_number=self._n(),
                item_id=self.item.id,
                part=part,
            ),
            OutputItemEvent(
                type="response.output_item.done", sequence_number=self._n(), item=done_item
            ),
            ResponseLifecycleEvent(type=kind, sequence_number=self._n(), response=final),
        ]
