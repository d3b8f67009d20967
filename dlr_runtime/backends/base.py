"""The backend contract: what the engine calls to advance recurrent state.

Every backend ("torch" = `RecurrentModel` itself, "torch-fast", "fused", "onnx") implements
`Backend`. State is a dict of batch-first tensors in the backend's own layout, derived from
`state_spec.state_spec` (so `init_state` and `state_bytes` never restate it); `to_canonical` /
`from_canonical` convert one to the canonical layout (`RecurrentModel`'s, complex "ssm"),
which snapshots carry, so a session moves between backends and replicas.

Calls are pure: `step` / `chunk` return new state tensors and leave their inputs alone.
Batching never changes a session's outputs beyond float rounding of batched matmuls.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..config import DLRConfig

State = dict[str, torch.Tensor]


@runtime_checkable
class Backend(Protocol):
    name: str  # what /v1/models reports
    config: DLRConfig

    @property
    def device(self) -> torch.device: ...

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        """Zero state for `batch` sessions, in this backend's layout."""
        ...

    def state_bytes(self) -> int:
        """Bytes of one session's state in this backend's layout."""
        ...

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One input per session: token ids (B,) -> logits (B, V); audio samples (B,) ->
        current class scores (B, C)."""
        ...

    def chunk(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """T inputs per session (B, T) -> outputs (B, T', out_dim) after every position
        (tokens) or completed frame (audio)."""
        ...

    def scores(self, state: State) -> torch.Tensor:
        """Classifier: current class scores (B, C) from the running mean."""
        ...

    def to_canonical(self, state: State) -> State:
        """This backend's state -> the canonical layout (at this backend's precision)."""
        ...

    def from_canonical(self, state: State) -> State:
        """A canonical state -> this backend's layout, on its device."""
        ...
