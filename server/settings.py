"""Server settings: read from `DLR_*` environment variables (and `dlr-serve` flags).

Every batching knob and limit of the server lives here with its default; `dlr-serve --help`
lists them too. Example: `DLR_PORT=9000 DLR_MAX_BATCH_SIZE=1 dlr-serve`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent.parent / "models"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DLR_", extra="ignore")

    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 = any free port)")
    models_dir: Path = Field(DEFAULT_MODELS_DIR, description="one checkpoint directory per model")
    device: str = Field("auto", description="auto (cuda when available), cpu, cuda, cuda:N")
    backend: Literal["auto", "torch", "fused", "torch-fast", "onnx"] = Field(
        "fused",
        description=(
            "inference backend: fused (default: numba decode step of token LMs and numba"
            " layer block of audio chunks, the fastest measured here, benchmarks/RESULTS.md;"
            " the torch form wherever numba cannot build), torch, torch-fast (compiled step /"
            " CUDA graphs), onnx, or auto (time the candidates at startup, keep the fastest)"
        ),
    )
    state_dtype: Literal["complex64", "complex128"] = Field(
        "complex64", description="dtype of the recurrent state"
    )
    gc_freeze: bool = Field(
        True,
        description=(
            "once ready, freeze the startup heap out of the garbage collector's reach (a full"
            " collection of it stalled every stream for 210-380 ms)"
        ),
    )
    keep_freed_memory: bool = Field(
        True,
        description=(
            "glibc malloc keeps freed batch tensors for reuse instead of unmapping them"
            " (no page faults per batch; dlr_runtime/engine/malloc.py)"
        ),
    )
    torch_threads: int = Field(
        1,
        ge=0,
        description="CPU threads of each engine (0 = torch's default; raise for big models)",
    )
    max_sessions: int = Field(
        256, ge=1, description="state slots per model: live sessions of one model"
    )
    max_total_sessions: int = Field(
        0, ge=0, description="server-wide cap on live sessions of all models (0 = none)"
    )
    max_batch_size: int = Field(64, ge=1, description="rows per batched call, per operation")
    max_batch_wait_ms: float = Field(
        2.0, ge=0, description="wait this long for more work before a batch without decodes"
    )
    max_prefill_tokens: int = Field(
        2048, ge=1, description="prompt tokens one session prefills per batch at most"
    )
    max_prefill_tokens_decoding: int = Field(
        256,
        ge=1,
        description="the same while other sessions are generating (bounds their token stall)",
    )
    max_chunk_frames: int = Field(
        64, ge=1, description="audio frames one speech session feeds per batch at most"
    )
    idle_timeout_s: float = Field(
        300.0, gt=0, description="close WebSocket sessions idle this long"
    )
    max_frame_bytes: int = Field(1 << 20, ge=1024, description="largest WebSocket message")
    max_queued_audio_s: float = Field(
        30.0, gt=0, description="audio a speech session may have waiting before it is refused"
    )
    max_new_tokens: int = Field(1024, ge=1, description="cap on tokens generated per request")
    max_prompt_chars: int = Field(65536, ge=1, description="largest prompt or appended text")
    max_prompt_tokens: int = Field(
        65536,
        ge=1,
        description="largest prompt, or text appended at once, in tokens (refused with 400)",
    )
    # ---- prefix-state cache and stored responses (OpenAI surface)
    prefix_cache_mb: float = Field(
        256.0, ge=0, description="exact prompt states cached per model, MiB (0 = off)"
    )
    response_ttl_s: float = Field(
        3600.0, gt=0, description="how long a stored /v1/responses state is kept"
    )
    response_store_mb: float = Field(
        512.0, gt=0, description="RAM for stored responses when no state store is configured"
    )
    partial_interval_ms: float = Field(
        100.0, ge=0, description="at most one partial speech result per this interval"
    )
    retry_after_s: int = Field(1, ge=0, description="Retry-After sent with 429 responses")
    log_level: str = Field("info", description="logging level")
    # ---- sessions that survive disconnects and restarts
    resume_grace_s: float = Field(
        60.0, ge=0, description="keep a dropped WebSocket session this long for resume (0 = off)"
    )
    resume_buffer_messages: int = Field(
        1100, ge=1, description="server messages kept per session for replay after a resume"
    )
    state_dir: Path | None = Field(
        None, description="directory where live sessions are persisted on SIGTERM (unset = off)"
    )
    drain_timeout_s: float = Field(
        10.0, ge=0, description="on SIGTERM, wait this long for in-flight work before persisting"
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="server processes on the port (SO_REUSEPORT), each with its own engines; "
        "more than 1 needs DLR_STATE_STORE=redis://... (server/workers.py)",
    )
    max_state_bytes: int = Field(
        16 << 20, ge=1024, description="largest session state blob accepted by POST /v1/sessions"
    )
    # ---- durable sessions (server/durable.py)
    state_store: str = Field(
        "memory",
        description="where session checkpoints and parked sessions live: memory (this "
        "process only), dir:PATH, or redis://HOST:PORT/DB (shared by replicas)",
    )
    state_secret: str = Field(
        "",
        repr=False,
        description="HMAC secret of exported and stored session states (the same on every "
        "replica; unset = a random one, logged, valid in this process only)",
    )
    state_max_sessions: int = Field(
        0, ge=0, description="most sessions kept in the state store (0 = no cap)"
    )
    state_max_bytes: int = Field(
        0, ge=0, description="most bytes kept in the state store (0 = no cap)"
    )
    state_ttl_s: float = Field(
        86400.0, ge=0, description="lifetime of a stored session after its last write (0 = none)"
    )
    checkpoint_audio_s: float = Field(
        5.0,
        gt=0,
        le=30,
        description="a speech stream is checkpointed every this many seconds of audio (store "
        "other than memory)",
    )
    park_after_idle_s: float = Field(
        60.0, ge=0, description="park a text session idle this long (slot freed; 0 = never)"
    )
    parked_ram_bytes: int = Field(
        64 << 20, ge=0, description="parked snapshots kept in RAM before only the store has them"
    )
    # ---- admission and backpressure
    backpressure_audio_s: float = Field(
        5.0, gt=0, description="queued audio at which a speech session stops reading its socket"
    )
    backpressure_timeout_s: float = Field(
        10.0, gt=0, description="a session held back this long is closed with 1013"
    )
    max_total_queued_audio_s: float = Field(
        600.0,
        gt=0,
        description="audio waiting across all sessions beyond which new work is refused",
    )
    max_queued_requests: int = Field(
        1024, ge=1, description="prefills waiting per model beyond which new work is refused"
    )
    # ---- keepalive
    ws_ping_interval_s: float = Field(20.0, gt=0, description="WebSocket ping interval")
    ws_ping_timeout_s: float = Field(
        30.0, gt=0, description="close a WebSocket whose pong is this late"
    )
    ws_compression: bool = Field(
        False,
        description="permessage-deflate on WebSockets (costs CPU; PCM audio barely compresses)",
    )
    # ---- security
    api_keys: str = Field(
        "",
        description="comma-separated bearer tokens; when set every endpoint but /healthz, "
        "/readyz and /metrics needs one",
    )
    cors_origins: str = Field(
        "",
        description="comma-separated origins allowed cross-origin (HTTP CORS and WebSocket "
        "Origin); '*' = any; same-origin always works",
    )
    allowed_hosts: str = Field(
        "",
        description="comma-separated Host names trusted for browser requests without API keys "
        "(besides loopback, IP literals and `host`); '*' = any",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="close a connection whose request headers take longer"
    )
    body_timeout_s: float = Field(
        10.0, gt=0, description="408 when a request body read waits longer than this"
    )
    keep_alive_s: float = Field(5.0, gt=0, description="close idle keep-alive connections")
    max_connections_per_client: int = Field(
        128, ge=0, description="open WebSockets one client address may hold (0 = no cap)"
    )
    max_detached_per_client: int = Field(
        4,
        ge=0,
        description="dropped sessions one client address may keep for resume; beyond, its "
        "oldest is closed (0 = no cap)",
    )
    max_request_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="largest HTTP request body (POST /v1/sessions: max_state_bytes)",
    )

    def key_list(self) -> list[str]:
        return [k.strip() for k in self.api_keys.split(",") if k.strip()]

    def allowed_host_list(self) -> list[str]:
        return [h.strip() for h in self.allowed_hosts.split(",") if h.strip()]

    def origin_list(self) -> list[str]:
        return [o.strip().rstrip("/") for o in self.cors_origins.split(",") if o.strip()]
