"""The "fused" backend for audio models: `RecurrentModel` with each layer's chunk in one
compiled call (`fused_block.ssm_block`, numba, CPU).

The server feeds speech in chunks of a few frames (5 per 100 ms at a 20 ms stride). There the
torch chunk form spends most of its time in tiny batched matmuls over the (B, H, N) state;
the fused block runs the recurrence with each row's state in cache instead. Everything around
the recurrence (front end, norms, GLU, heads, framing) is `RecurrentModel`'s own code, called
with the fused block (`RecurrentModel.chunk(..., block=)`), and the state is the canonical
layout, so snapshots and tests are shared with the torch backend. Per-sample `step` stays
the torch form (the server does not use it for audio).
"""

from __future__ import annotations

import torch

from ..recurrent import RecurrentModel
from ..state_spec import Spec
from . import fused_block as fb

State = dict[str, torch.Tensor]


class FusedAudioBackend:
    """An audio model's `RecurrentModel` with the fused layer block in its chunk form."""

    name = "fused"

    def __init__(self, rec: RecurrentModel, warm: bool = True) -> None:
        if not fb.AVAILABLE:
            raise RuntimeError("the fused backend needs numba (pip install numba)")
        if rec.device.type != "cpu":
            raise RuntimeError(f"the fused block runs on the CPU, the model is on {rec.device}")
        if rec.config.encoder != "audio":
            raise ValueError("FusedAudioBackend serves audio models")
        self.rec = rec
        self.config = rec.config
        self.layers = [
            fb.layer_planes(
                rec.lam[i], rec.C[i], rec.D[i], None if rec.b_is_one[i] else rec.B[i], rec.rdtype
            )
            for i in range(rec.n_layers)
        ]
        if warm:  # compile (or load from the on-disk cache) now, not inside the first stream
            self.chunk(torch.zeros(1, 2 * rec.config.frame_stride), self.init_state(1))

    # ------------------------------------------------------------------ state: canonical
    @property
    def device(self) -> torch.device:
        return self.rec.device

    @property
    def spec(self) -> Spec:
        return self.rec.spec

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        return self.rec.init_state(batch, device)

    def state_bytes(self) -> int:
        return self.rec.state_bytes()

    def state_bytes_per_session(self) -> int:
        return self.rec.state_bytes()

    def to_canonical(self, state: State) -> State:
        return self.rec.to_canonical(state)

    def from_canonical(self, state: State) -> State:
        return self.rec.from_canonical(state)

    # ------------------------------------------------------------------ compute
    def _block(
        self, i: int, u: torch.Tensor, x0: torch.Tensor, out: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return fb.ssm_block(u, x0, self.layers[i], out)

    @torch.no_grad()
    def chunk(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Audio samples (B, T) -> class scores after every completed frame (B, F, C)."""
        return self.rec.chunk(x, state, block=self._block)

    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        return self.rec.step(x_t, state)

    def scores(self, state: State) -> torch.Tensor:
        return self.rec.scores(state)

    def describe(self) -> dict:
        return {"backend": self.name, "device": "cpu", "kernel": "numba (audio chunk)"}
