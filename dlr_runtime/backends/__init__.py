"""Backends: objects that advance recurrent state (`init_state`, `step`, `chunk`, `scores`).

`make_backend(rec, name)` turns a loaded `RecurrentModel` into the backend the engine calls:

- "torch": the `RecurrentModel` itself (it already has the backend methods), named "torch".
- "onnx": an ONNX Runtime session built from it (`dlr_runtime.backends.onnx.OnnxBackend`),
  imported lazily so torch-only installs never load onnxruntime.
- "auto": measure and take the fastest for this model on this device
  (`autoselect.pick_fastest`): on CUDA between `FastTorchBackend` (the decode step replayed as
  a CUDA graph per batch size) and ONNX Runtime, on CPU between torch and ONNX Runtime. Building
  the ONNX candidate exports the model, which adds seconds to startup. Engine snapshots always
  use the torch layout, so sessions move between replicas whatever each one picked.
"""

from __future__ import annotations

from typing import Any

from ..recurrent import RecurrentModel

BACKEND_NAMES = ("torch", "onnx", "auto")


def make_backend(rec: RecurrentModel, name: str = "auto", **options: Any) -> Any:
    """Return a backend for `rec`; `options` go to the backend's constructor (onnx only)."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKEND_NAMES}")
    if name == "auto":
        from .autoselect import pick_fastest  # noqa: PLC0415

        candidates = ("torch-fast", "onnx") if rec.device.type == "cuda" else ("torch", "onnx")
        _, backend, _ = pick_fastest(rec, candidates)
        return backend
    if name == "torch":
        if options:
            raise ValueError(f"the torch backend takes no options, got {sorted(options)}")
        return rec
    from .onnx import OnnxBackend  # noqa: PLC0415  (optional dependency, loaded on demand)

    return OnnxBackend.from_recurrent(rec, **options)


__all__ = ["BACKEND_NAMES", "make_backend"]
