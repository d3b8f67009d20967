"""Backends: objects that advance recurrent state (`init_state`, `step`, `chunk`, `scores`).

`make_backend(rec, name)` turns a loaded `RecurrentModel` into the backend the engine calls:

- "torch": the `RecurrentModel` itself (it already has the backend methods), named "torch".
- "fused": a token LM's decode step in one compiled call (`backends.fused`, numba, CPU);
  falls back to "torch" without numba or off the CPU.
- "torch-fast": the decode step compiled (CPU) or replayed as CUDA graphs (GPU).
- "onnx": an ONNX Runtime session built from it (`dlr_runtime.backends.onnx.OnnxBackend`),
  imported lazily so torch-only installs never load onnxruntime.
- "auto": measure and take the fastest for this model on this device
  (`autoselect.pick_fastest` over `autoselect.default_candidates`): on CUDA between
  "torch-fast" and ONNX Runtime, on CPU between "fused" (token LMs, with numba), torch and
  ONNX Runtime. Building
  the ONNX candidate exports the model, which adds seconds to startup. Engine snapshots always
  use the torch layout, so sessions move between replicas whatever each one picked.
"""

from __future__ import annotations

from typing import Any

from ..recurrent import RecurrentModel
from .base import Backend

BACKEND_NAMES = ("torch", "fused", "torch-fast", "onnx", "auto")


def make_backend(rec: RecurrentModel, name: str = "auto", **options: Any) -> Backend:
    """Return a backend for `rec`; `options` go to the backend's constructor (onnx, torch-fast)."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKEND_NAMES}")
    if name == "auto":
        from .autoselect import default_candidates, pick_fastest  # noqa: PLC0415

        _, backend, _ = pick_fastest(rec, default_candidates(rec))
        return backend
    if name == "torch":
        if options:
            raise ValueError(f"the torch backend takes no options, got {sorted(options)}")
        return rec
    if name == "fused":
        from .fused import make_fused  # noqa: PLC0415

        return make_fused(rec)
    if name == "torch-fast":
        from .torch_compiled import FastTorchBackend  # noqa: PLC0415

        return FastTorchBackend(rec, **options)
    from .onnx import OnnxBackend  # noqa: PLC0415  (optional dependency, loaded on demand)

    return OnnxBackend.from_recurrent(rec, **options)


__all__ = ["BACKEND_NAMES", "Backend", "make_backend"]
