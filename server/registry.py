"""Loading the models of the models directory: one `Engine` + `Scheduler` per checkpoint dir.

A model's name is its directory name; names must match `MODEL_NAME_RE` (no path separators,
no leading dot). A directory that fails to load is skipped with a logged error, so one bad
checkpoint never stops the server. An empty or missing directory serves no models.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dlr_runtime import CheckpointError, load_recurrent
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from dlr_runtime.engine.prefix_cache import PrefixCache

from .metrics import Metrics
from .scheduler import Scheduler
from .settings import Settings

log = logging.getLogger("dlr.server")
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def valid_model_name(name: str) -> bool:
    return bool(MODEL_NAME_RE.match(name)) and ".." not in name


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@dataclass
class ModelEntry:
    name: str
    kind: str  # "lm" | "speech"
    engine: Engine
    scheduler: Scheduler
    path: Path
    sessions: int = 0  # open sessions of this model (limit: settings.max_sessions)
    metadata: dict[str, Any] = field(default_factory=dict)  # the checkpoint's (chat_template)

    def info(self, settings: Settings) -> dict[str, Any]:
        cfg = self.engine.config
        out: dict[str, Any] = {
            "id": self.name,
            "object": "model",
            "owned_by": "dlr-serve",
            "name": self.name,
            "kind": self.kind,
            "backend": getattr(self.engine.backend, "name", "torch"),
            "device": str(self.engine.device),
            "state_bytes_per_session": self.engine.state_bytes_per_session(),
            "config": {"d_model": cfg.d_model, "d_state": cfg.d_state, "n_layers": cfg.n_layers},
            "limits": {
                "max_sessions": settings.max_sessions,
                "max_total_sessions": settings.max_total_sessions,
                "max_batch_size": settings.max_batch_size,
                "max_frame_bytes": settings.max_frame_bytes,
            },
        }
        if self.kind == "speech":
            out["labels"] = list(cfg.labels)
            out["sample_rate"] = cfg.sample_rate
            out["frame_stride"] = cfg.frame_stride
            out["frame_window"] = cfg.window  # samples each frame's front end sees
            out["feature_norm_s"] = cfg.feature_norm_s  # causal feature mean subtraction (0: off)
            out["limits"]["max_queued_audio_s"] = settings.max_queued_audio_s
        else:
            tok = self.engine.tokenizer
            out["vocab"] = {"type": "bytes", "size": cfg.vocab_size, "bos": tok.bos, "eos": tok.eos}
            out["limits"]["max_new_tokens"] = settings.max_new_tokens
            out["limits"]["max_prompt_chars"] = settings.max_prompt_chars
        return out


def load_models(settings: Settings, metrics: Metrics) -> dict[str, ModelEntry]:
    """Load every checkpoint directory in `settings.models_dir` (schedulers not yet started)."""
    root = Path(settings.models_dir)
    if not root.is_dir():
        log.warning("models directory %s does not exist; serving no models", root)
        return {}
    device = resolve_device(settings.device)
    dtype = torch.complex64 if settings.state_dtype == "complex64" else torch.complex128
    models: dict[str, ModelEntry] = {}
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        if not valid_model_name(path.name):
            log.warning("skipping %s: not a valid model name", path)
            continue
        if not (path / "config.json").is_file():
            continue
        if not path.resolve().is_relative_to(root.resolve()):
            log.warning("skipping %s: it links outside the models directory", path)
            continue
        try:
            rec = load_recurrent(path, dtype=dtype, device=device)
            backend = make_backend(rec, settings.backend)
            engine = Engine(
                backend,
                path.name,
                settings.max_sessions,
                metadata=rec.checkpoint_metadata,
                weights_hash=file_sha256(path / "model.safetensors"),
            )
        except (CheckpointError, ValueError, RuntimeError, ImportError, OSError) as e:
            log.error("skipping model %s: %s", path, e)
            continue
        sched = Scheduler(
            engine,
            metrics,
            max_batch_size=settings.max_batch_size,
            max_batch_wait_s=settings.max_batch_wait_ms / 1000,
            max_chunk_frames=settings.max_chunk_frames,
            torch_threads=settings.torch_threads,
            max_prefill_tokens=settings.max_prefill_tokens,
            prefix_cache=(
                PrefixCache(int(settings.prefix_cache_mb * 2**20))
                if engine.kind == "lm" and settings.prefix_cache_mb > 0
                else None
            ),
            max_prefill_tokens_decoding=settings.max_prefill_tokens_decoding,
        )
        meta = dict(rec.checkpoint_metadata or {})
        models[path.name] = ModelEntry(path.name, engine.kind, engine, sched, path, metadata=meta)
        log.info("loaded model %s (%s) on %s", path.name, engine.kind, device)
    return models
