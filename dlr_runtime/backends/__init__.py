"""Backends: objects that advance recurrent state (`init_state`, `step`, `chunk`, `scores`).

`make_backend(rec, name)` turns a loaded `RecurrentModel` into the backend the engine calls:

- "torch": the `RecurrentModel` itself (it already has the backend methods), named "torch".
- "onnx": an ONNX Runtime session built from it (`dlr_runtime.backends.onnx.OnnxBackend`),
  imported lazily so torch-only installs never load onnxruntime.
- "auto": on CUDA, `FastTorchBackend` (the decode step replayed as a CUDA graph per batch
  size, same state layout as "torch"); on CPU, "torch". `autoselect.pick_fastest` can time the
  candidates, but "auto" does not pick ONNX on its own yet: its state layout (real/imaginary
  pairs) differs from torch's, so session snapshots would not move between replicas that
  chose differently. Ask for "onnx" explicitly to use it.
"""

from __future__ import annotations

from typing import Any

from ..recurrent import RecurrentModel

BACKEND_NAMES = ("torch", "onnx", "auto")


def make_backend(rec: RecurrentModel, name: str = "auto", **options: Any) -> Any:
    """Return a backend for `rec`; `options` go to the backend's constructor (onnx only)."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKEND_NAMES}")
    if name == "auto" and rec.device.type == "cuda":
        from .torch_compiled import FastTorchBackend  # noqa: PLC0415

        return FastTorchBackend.from_recurrent(rec, **options)
    if name in ("torch", "auto"):
        if options:
            raise ValueError(f"the torch backend takes no options, got {sorted(options)}")
        rec.name = "torch"
        return rec
    from .onnx import OnnxBackend  # noqa: PLC0415  (optional dependency, loaded on demand)

    return OnnxBackend.from_recurrent(rec, **options)


__all__ = ["BACKEND_NAMES", "make_backend"]
