"""Pick the fastest backend for a model on its device by measuring it (for `backend="auto"`).

    name, backend, timings = pick_fastest(rec)

Builds each candidate ("torch": the RecurrentModel itself, "fused": the numba decode step,
"torch-fast": the compiled / CUDA-graph decode step, "onnx": ONNX Runtime), times the call the server makes most (LM: one
decode step at a few batch sizes; audio: a 100 ms chunk at a few batch sizes), and returns the
one with the least total median time, plus every candidate's timings. A candidate that fails
to build or run is skipped (its error is logged and recorded as an infinite time), so "auto"
always ends with a working backend ("torch" at worst). Building "onnx" exports the model
(seconds); "torch-fast" on CPU compiles per batch size (tens of seconds), so it is only a
candidate when asked for.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from ..export.realmath import unexportable
from ..recurrent import RecurrentModel
from .timing import per_call_seconds

log = logging.getLogger(__name__)
DEFAULT_CANDIDATES = ("torch", "onnx")


def build(rec: RecurrentModel, name: str) -> Any:
    """One candidate backend for `rec` by name."""
    if name == "torch":
        return rec
    if name == "onnx":
        from .onnx import OnnxBackend  # noqa: PLC0415  (onnxruntime only when asked for)

        return OnnxBackend.from_recurrent(rec)
    if name == "fused":
        from .fused import build_fused  # noqa: PLC0415  (numba only when asked for)

        return build_fused(rec)
    if name == "torch-fast":
        from .torch_compiled import FastTorchBackend  # noqa: PLC0415

        return FastTorchBackend(rec)
    raise ValueError(f"unknown backend candidate {name!r}")


def default_candidates(rec: RecurrentModel) -> tuple[str, ...]:
    """What "auto" compares for `rec`: on CUDA torch-fast and onnx; on the CPU fused (with
    numba), torch and onnx; onnx only where the network has an exported graph."""
    if rec.device.type == "cuda":
        names: tuple[str, ...] = ("torch-fast", "onnx")
    else:
        from .fused import fused_supported  # noqa: PLC0415

        names = ("fused", "torch", "onnx") if fused_supported(rec) is None else DEFAULT_CANDIDATES
    if unexportable(rec.config):  # no ONNX graph: only the backends that run its own code
        names = tuple(n for n in names if n != "onnx")
    return names


def measure(backend: Any, batch_sizes: Sequence[int], reps: int) -> float:
    """Total seconds per hot call over `batch_sizes` (each timed over `reps` calls)."""
    cfg, dev = backend.config, backend.device
    total = 0.0
    for b in batch_sizes:
        state = backend.init_state(b)
        if cfg.encoder == "tokens":
            x = torch.randint(0, cfg.vocab_size, (b,), device=dev)
            total += per_call_seconds(lambda x=x, s=state: backend.step(x, s), reps)
        else:
            x = 0.1 * torch.randn(b, cfg.sample_rate // 10, device=dev)  # 100 ms of audio
            total += per_call_seconds(lambda x=x, s=state: backend.chunk(x, s), reps)
    return total


def pick_fastest(
    rec: RecurrentModel,
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    batch_sizes: Sequence[int] = (1, 16),
    reps: int = 7,
) -> tuple[str, Any, dict[str, float]]:
    """(name, backend, {candidate: seconds}) of the fastest candidate for `rec`."""
    if not candidates:
        raise ValueError("pick_fastest needs at least one candidate")
    timings: dict[str, float] = {}
    built: dict[str, Any] = {}
    for name in candidates:
        try:
            be = build(rec, name)
            timings[name] = measure(be, batch_sizes, reps)
            built[name] = be
        except Exception as e:  # a broken candidate must not stop the server from starting
            log.warning("backend candidate %s failed: %s", name, e)
            timings[name] = math.inf
    if not built:
        log.warning("no candidate backend worked; using torch")
        return "torch", rec, timings
    best = min(built, key=lambda k: timings[k])
    log.info(
        "backend auto-selection on %s: %s -> %s",
        rec.device,
        ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in timings.items()),
        best,
    )
    return best, built[best], timings
