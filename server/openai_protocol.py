"""Request models of the OpenAI-compatible API: chat completions, completions, responses.

The engine never sees these objects: `to_job(...)` converts a request at the boundary into a
`TextJob` (prompt tokens, message boundaries for the prefix cache, one `SamplingParams` per
choice, `LogitParams`), the engine-facing form the routes hand to the scheduler.

Field policy (what a client library may send):
- fields this server implements are validated (ranges as OpenAI's; FastAPI answers 422 naming
  the field);
- fields OpenAI defines that would change the result but are not implemented here (tools,
  response_format other than text, audio, ...) are declared and checked by `check_supported()`,
  which raises `UnsupportedField` (HTTP 400 with the field as `param`) when one is set to a
  value other than its neutral one; they are never silently ignored;
- fields that do not change the result (user, metadata, service_tier, store on chat, ...) and
  unknown fields are accepted and ignored.

Seeds: with `seed` s and n choices, choice i samples with seed s + i (without a seed each
choice draws its own and reports nothing). Chat prompts are rendered with the model's
`ChatTemplate`; completion prompts are `[bos] + bytes`, as `/v1/completions` does today.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dlr_runtime.engine import ByteTokenizer, SamplingParams
from dlr_runtime.engine.logit_processors import MAX_TOP_LOGPROBS, LogitParams

from .chat_template import ChatTemplate, Message
from .errors import api_error

MAX_N = 16  # choices per request (each holds a session slot while it decodes)
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the one `include` value responses support


class UnsupportedField(ValueError):
    """A request sets a field that would change its result but is not implemented."""

    def __init__(self, field_name: str, detail: str = "") -> None:
        self.field = field_name
        msg = f"{field_name} is not supported by this server"
        super().__init__(f"{msg}: {detail}" if detail else msg)

    def response(self) -> JSONResponse:
        return api_error(400, str(self), "unsupported_field", param=self.field)


@dataclass
class TextJob:
    """Engine-facing form of one text request (no pydantic)."""

    tokens: list[int]  # prompt token ids, bos first (unless a continuation of a stored state)
    boundaries: list[int]  # token offsets after each message (prefix-cache insert points)
    sampling: list[SamplingParams]  # one per choice
    logits: LogitParams  # penalties, bias, logprobs (shared by the choices)
    stream: bool = False
    include_usage: bool = False  # stream a final usage chunk
    echo: bool = False  # completions: put the prompt before the generated text
    prompt_text: str = ""  # the rendered prompt (for echo)
    continuation: bool = False  # tokens continue the state of `previous_response_id`
    previous_response_id: str | None = None
    store: bool = False  # responses: keep the final state and output under the response id
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- shared fields
Stop = str | list[str] | None


def _neutral(value: Any) -> bool:
    return value is None or value is False or value in ([], {}, 0, "")


class OpenAIRequest(BaseModel):
    """Fields common to the three request kinds."""

    model_config = ConfigDict(extra="allow")  # unknown fields accepted (kept, never used)

    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)  # extension (vLLM): 0 = off
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    user: str | None = None  # accepted, no effect
    metadata: dict[str, Any] | None = None  # accepted, no effect
    service_tier: str | None = None  # accepted, no effect

    # known to OpenAI / vLLM, would change results, not implemented: refused when set
    REFUSED: ClassVar[tuple[str, ...]] = (
        "tools",
        "functions",
        "function_call",
        "audio",
        "prediction",
        "reasoning_effort",
        "reasoning",
        "web_search_options",
        "min_p",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "use_beam_search",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "suffix",
        "stop_token_ids",
        "include_stop_str_in_output",
        "continue_final_message",
        "chat_template",
        "chat_template_kwargs",
        "length_penalty",
        "truncate_prompt_tokens",
        "allowed_token_ids",
        "bad_words",
        "logits_processors",
        "prompt_logprobs",
    )
    # neutral values of refused fields other than None / False / 0 / "" / [] / {}
    NEUTRAL: ClassVar[dict[str, tuple[Any, ...]]] = {
        "response_format": ({"type": "text"},),
        "tool_choice": ("none", "auto"),
        "modalities": (["text"],),
        "best_of": (1,),
        "add_generation_prompt": (True,),
        "verbosity": ("medium",),
        "n": (1,),
    }
    CHECKED: ClassVar[tuple[str, ...]] = (  # the fields of NEUTRAL this request kind checks
        "response_format",
        "tool_choice",
        "modalities",
        "best_of",
        "add_generation_prompt",
        "verbosity",
    )

    def check_supported(self) -> None:
        """Raise UnsupportedField for the first result-changing field that is not supported."""
        extra = self.model_extra or {}

        def value(name: str) -> Any:
            v = getattr(self, name, None) if name in type(self).model_fields else None
            return extra.get(name) if v is None else v

        for name in self.REFUSED:
            if not _neutral(value(name)):
                raise UnsupportedField(name)
        for name in self.CHECKED:
            v, ok = value(name), self.NEUTRAL[name]
            if v is not None and v not in ok:
                raise UnsupportedField(name, "only " + " or ".join(repr(x) for x in ok))
        if extra.get("background") not in (None, False):
            raise UnsupportedField("background")

    def _sampling(self, n: int, max_tokens: int, stop: list[str]) -> list[SamplingParams]:
        seeds = [None] * n if self.seed is None else [(self.seed + i) % 2**63 for i in range(n)]
        return [
            SamplingParams(
                temperature=self.temperature,
                top_k=self.top_k,
                top_p=self.top_p,
                seed=s,
                max_tokens=max_tokens,
                stop=list(stop),
            )
            for s in seeds
        ]


def _stops(v: Stop) -> list[str]:
    stops = [v] if isinstance(v, str) else list(v or [])
    if len(stops) > 4 or any(not s or len(s) > 256 for s in stops):
        raise ValueError("stop: at most 4 non-empty strings of up to 256 characters")
    return stops


class PenaltyFields(BaseModel):
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[int, float] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: Stop = Field(None, validate_default=True)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[int, float] | None) -> dict[int, float] | None:
        for tok, b in (v or {}).items():
            if tok < 0 or not -100 <= b <= 100:
                raise ValueError("logit_bias: token ids >= 0 mapped to values in [-100, 100]")
        return v

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: Stop) -> list[str]:
        return _stops(v)

    def _logit_params(self, logprobs: bool, top: int, vocab: int) -> LogitParams:
        bias = dict(self.logit_bias or {})
        bad = [t for t in bias if t >= vocab]
        if bad:
            raise UnsupportedField("logit_bias", f"token ids {bad} are not in [0, {vocab})")
        return LogitParams(
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=bias,
            logprobs=logprobs,
            top_logprobs=top,
        )


# ---------------------------------------------------------------- chat completions
class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "input_text", "output_text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = ""
    name: str | None = None  # accepted, not rendered
    tool_calls: list[Any] | None = None

    def to_message(self) -> Message:
        if self.tool_calls:
            raise UnsupportedField("messages.tool_calls")
        text = (
            self.content
            if isinstance(self.content, str)
            else "".join(p.text for p in self.content or [])
        )
        return Message(role="system" if self.role == "developer" else self.role, content=text)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatCompletionRequest(OpenAIRequest, PenaltyFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)  # wins over max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None  # accepted, no effect on the result
    parallel_tool_calls: bool | None = None  # meaningful only with tools

    REFUSED = (*OpenAIRequest.REFUSED, "echo", "max_output_tokens")

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise UnsupportedField("top_logprobs", "needs logprobs: true")
        if self.stream_options is not None and not self.stream:
            raise UnsupportedField("stream_options", "only with stream: true")

    def to_job(
        self, tokenizer: ByteTokenizer, template: ChatTemplate, default_max_tokens: int
    ) -> TextJob:
        self.check_supported()
        rendered = template.render([m.to_message() for m in self.messages], tokenizer)
        limit = self.max_completion_tokens
        limit = self.max_tokens if limit is None else limit
        max_tokens = default_max_tokens if limit is None else limit
        stops = [*self.stop, *(s for s in template.stop if s not in self.stop)]  # type: ignore[union-attr]
        return TextJob(
            tokens=rendered.tokens,
            boundaries=rendered.boundaries,
            sampling=self._sampling(self.n, max_tokens, stops),
            logits=self._logit_params(self.logprobs, self.top_logprobs or 0, tokenizer.vocab_size),
            stream=self.stream,
            include_usage=bool(self.stream_options and self.stream_options.include_usage),
            prompt_text=rendered.text,
        )


# ---------------------------------------------------------------- completions
class CompletionRequest(OpenAIRequest, PenaltyFields):
    """POST /v1/completions (legacy): one prompt, logprobs as an int (top count), echo, n."""

    prompt: str | list[str] | list[int] = ""  # text, [text], or token ids (bos is added)
    max_tokens: int = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=5)  # OpenAI's limit for completions
    echo: bool = False
    stream_options: StreamOptions | None = None

    # chat's names of what completions spells `logprobs: N` / `max_tokens`: never ignored
    REFUSED = (*OpenAIRequest.REFUSED, "top_logprobs", "max_completion_tokens",
               "max_output_tokens")  # fmt: skip

    def check_supported(self) -> None:
        super().check_supported()
        if self.stream_options is not None and not self.stream:
            raise UnsupportedField("stream_options", "only with stream: true")

    @field_validator("prompt")
    @classmethod
    def _single(cls, v: str | list[str] | list[int]) -> str | list[int]:
        if isinstance(v, str) or all(isinstance(x, int) for x in v) and v:
            return v
        if len(v) == 1:
            return v[0]  # type: ignore[return-value]
        raise ValueError("prompt: one prompt per request (text, [text] or token ids)")

    def to_job(self, tokenizer: ByteTokenizer) -> TextJob:
        self.check_supported()
        if isinstance(self.prompt, str):
            ids, text = tokenizer.encode(self.prompt), self.prompt
        else:
            ids = list(self.prompt)
            if min(ids) < 0 or max(ids) >= tokenizer.vocab_size:
                raise UnsupportedField(
                    "prompt", f"token ids must be in [0, {tokenizer.vocab_size})"
                )
            text = tokenizer.decode(ids)
        return TextJob(
            tokens=[tokenizer.bos, *ids],
            boundaries=[],
            sampling=self._sampling(self.n, self.max_tokens, list(self.stop or [])),
            logits=self._logit_params(
                self.logprobs is not None, self.logprobs or 0, tokenizer.vocab_size
            ),
            stream=self.stream,
            include_usage=bool(self.stream_options and self.stream_options.include_usage),
            echo=self.echo,
            prompt_text=text,
        )


# ---------------------------------------------------------------- responses
class InputMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def to_message(self) -> Message:
        return ChatMessageIn(role=self.role, content=self.content).to_message()


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponsesRequest(OpenAIRequest):
    """POST /v1/responses: a turn of a stored conversation (`previous_response_id`)."""

    input: str | list[InputMessage]
    instructions: str | None = None  # rendered as a system message before the input
    previous_response_id: str | None = None
    store: bool = True
    max_output_tokens: int | None = Field(None, ge=0)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    text: TextFormat | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    # not Responses API fields, but what a chat client might send: never silently ignored
    # (`conversation` and `prompt` (a stored prompt template) are Responses fields not
    # implemented here; `n` must stay 1: one output per response)
    REFUSED = (
        *OpenAIRequest.REFUSED,
        "conversation",
        "prompt",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "echo",
    )
    CHECKED = (*OpenAIRequest.CHECKED, "n")

    def check_supported(self) -> None:
        super().check_supported()
        fmt = self.text.format if self.text else None
        if fmt not in (None, {"type": "text"}):
            raise UnsupportedField("text.format", "only {'type': 'text'}")
        if self.text is not None and self.text.verbosity not in (None, "medium"):
            raise UnsupportedField("text.verbosity", "only 'medium'")
        if self.tool_choice not in (None, "none", "auto"):
            raise UnsupportedField("tool_choice", "no tools are available")
        other = [x for x in self.include or [] if x != LOGPROBS_INCLUDE]
        if other:
            raise UnsupportedField("include", f"only {LOGPROBS_INCLUDE!r}, not {other}")
        if self.truncation == "auto":
            raise UnsupportedField("truncation", "a stored state is never truncated")
        if self.instructions is not None and self.previous_response_id is not None:
            raise UnsupportedField(
                "instructions",
                "with previous_response_id the conversation continues from its stored state, "
                "so new instructions cannot go before its history",
            )

    def messages(self) -> list[Message]:
        items = (
            [InputMessage(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        out = [m.to_message() for m in items]
        if self.instructions is not None:
            out.insert(0, Message(role="system", content=self.instructions))
        return out

    def to_job(
        self, tokenizer: ByteTokenizer, template: ChatTemplate, default_max_tokens: int
    ) -> TextJob:
        """A follow-up (`previous_response_id`) renders only its new input as a continuation:
        its tokens go on from the stored state of that response, not from bos."""
        self.check_supported()
        cont = self.previous_response_id is not None
        rendered = template.render(self.messages(), tokenizer, continuation=cont)
        max_tokens = (
            default_max_tokens if self.max_output_tokens is None else self.max_output_tokens
        )
        top = self.top_logprobs or 0
        want_logprobs = top > 0 or LOGPROBS_INCLUDE in (self.include or [])
        return TextJob(
            tokens=rendered.tokens,
            boundaries=rendered.boundaries,
            sampling=self._sampling(1, max_tokens, list(template.stop)),
            logits=LogitParams(logprobs=want_logprobs, top_logprobs=top),
            stream=self.stream,
            prompt_text=rendered.text,
            continuation=cont,
            previous_response_id=self.previous_response_id,
            store=self.store,
        )
