"""Request models of the HTTP and WebSocket APIs; they convert themselves to engine types.

The engine never sees pydantic objects: `to_sampling()` turns request options into
`SamplingParams`. Field limits that depend on settings (max_new_tokens, prompt length) are
checked by the routes, which answer 422 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dlr_runtime.engine import SamplingParams

Stop = str | list[str] | None


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0, le=100)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: Stop = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Stop) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 8 or any(not s or len(s) > 256 for s in stops):
            raise ValueError("stop: at most 8 non-empty strings of up to 256 characters")
        return stops

    def to_sampling(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            max_tokens=max_tokens,
            stop=list(self.stop or []),
        )


class GenerateRequest(SamplingFields):
    prompt: str = ""
    max_new_tokens: int = Field(64, ge=0)
    stream: bool = False
    model: str | None = None


# ---------------------------------------------------------------- WebSocket messages
class SpeechStart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["start"]
    sample_rate: int = Field(ge=1000, le=384000)
    encoding: Literal["pcm_s16le", "pcm_f32le"] = "pcm_s16le"
    model: str | None = None
    interim_results: bool = True
    # continuous mode (keyword spotting); the options need mode "continuous" and default to
    # the model's operating point (its metadata's "detection"), see server/sessions/listening.py
    mode: Literal["utterance", "continuous"] = "utterance"
    threshold: float | None = Field(None, gt=0, le=1)
    keywords: dict[str, Annotated[float, Field(gt=0, le=1)]] | None = None
    listen: list[str] | None = Field(None, min_length=1, max_length=64)
    refractory_ms: float | None = Field(None, ge=0, le=60000)
    vad: bool = True  # continuous mode: gate the model with the voice-activity detector

    @field_validator("keywords")
    @classmethod
    def _few_keywords(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and len(v) > 64:
            raise ValueError("keywords: at most 64 entries")
        return v


class SpeechConfigure(BaseModel):
    """Continuous mode: change the detection options in the middle of a stream (answered with
    `configured`); the options given replace the current ones, the others stay."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["configure"]
    threshold: float | None = Field(None, gt=0, le=1)
    keywords: dict[str, Annotated[float, Field(gt=0, le=1)]] | None = Field(None, max_length=64)
    listen: list[str] | None = Field(None, min_length=1, max_length=64)
    refractory_ms: float | None = Field(None, ge=0, le=60000)


class SpeechEnd(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["end"]


class TextStart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["start"]
    model: str | None = None


class TextAppend(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["append"]
    text: str


class TextFork(BaseModel):
    """Copy the session's state into a new session (answered with `forked`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["fork"]


class TextGenerate(SamplingFields):
    type: Literal["generate"]
    max_new_tokens: int = Field(64, ge=0)


SpeechMessage = Annotated[SpeechStart | SpeechEnd | SpeechConfigure, Field(discriminator="type")]
TextMessage = Annotated[
    TextStart | TextAppend | TextGenerate | TextFork, Field(discriminator="type")
]
