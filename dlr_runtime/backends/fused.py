"""The "fused" backend: `RecurrentModel` semantics with the token step in one compiled call.

`FusedBackend` wraps a token LM's `RecurrentModel` and replaces `step` by
`fused_kernel.fused_step` (numba, CPU). Its state keeps the complex "ssm" as two real planes
"ssm_re", "ssm_im" (`state_spec.split_complex`, the ONNX backend's layout), so the kernel's
inner loop vectorises; `to_canonical` / `from_canonical` convert. Prefill (`chunk`) is the
wrapped model's chunk form on the canonical state. Measured on the shipped byte
LM (benchmarks/bench_decode.py): ~5x the torch step's tokens/s at batch 1.

Audio models get `fused_audio.FusedAudioBackend` instead (the layer block of the chunk form
fused; `build_fused` picks). Fallbacks: without numba, or for a model not on the CPU (CUDA
paths are untested here), `make_fused` returns the `RecurrentModel` itself and logs why.
"""

from __future__ import annotations

import logging

import torch

from ..recurrent import RecurrentModel
from ..state_spec import Spec, init_state, split_complex, state_bytes
from . import fused_kernel as fk
from .base import Backend

State = dict[str, torch.Tensor]
log = logging.getLogger(__name__)


class FusedBackend:
    """A token LM's `RecurrentModel` with the fused decode step."""

    name = "fused"

    def __init__(self, rec: RecurrentModel, warm: bool = True) -> None:
        if not fk.AVAILABLE:
            raise RuntimeError("the fused backend needs numba (pip install numba)")
        if rec.device.type != "cpu":
            raise RuntimeError(f"the fused step runs on the CPU, the model is on {rec.device}")
        self.rec = rec
        self.config = rec.config
        self.weights = fk.pack(rec)
        self._args = fk.kernel_args(self.weights)
        if warm:  # compile (or load from the on-disk cache) now, not inside the first request
            self.step(torch.zeros(1, dtype=torch.int64), self.init_state(1))

    # ------------------------------------------------------------------ state
    @property
    def device(self) -> torch.device:
        return self.rec.device

    @property
    def spec(self) -> Spec:
        """The canonical layout with "ssm" as real planes "ssm_re", "ssm_im" (B, L, H, N)."""
        return split_complex(self.rec.spec)

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        return init_state(self.spec, batch, self.device if device is None else device)

    def state_bytes(self) -> int:
        return state_bytes(self.spec)

    def state_bytes_per_session(self) -> int:
        return self.state_bytes()

    def to_canonical(self, state: State) -> State:
        out = {k: v for k, v in state.items() if k not in ("ssm_re", "ssm_im")}
        out["ssm"] = torch.complex(state["ssm_re"], state["ssm_im"])
        return out

    def from_canonical(self, state: State) -> State:
        out = {k: v.to(self.device) for k, v in state.items() if k != "ssm"}
        ssm = state["ssm"].to(self.device, self.rec.cdtype)
        out["ssm_re"], out["ssm_im"] = ssm.real.contiguous(), ssm.imag.contiguous()
        return out

    # ------------------------------------------------------------------ prefill: torch chunk form
    def chunk(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        y, new = self.rec.chunk(x, self.to_canonical(state))
        return y, self.from_canonical(new)

    def scores(self, state: State) -> torch.Tensor:
        return self.rec.scores(state)

    # ------------------------------------------------------------------ the fused step
    @torch.no_grad()
    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Token ids (B,) -> logits (B, V), new state (the input state is left as it was)."""
        vocab = self.config.vocab_size
        if x_t.dim() != 1 or x_t.shape[0] != state["ssm_re"].shape[0]:
            raise ValueError(
                f"step needs tokens (B,) matching the state's batch, got {tuple(x_t.shape)}"
            )
        tok = x_t.to("cpu", torch.int64).contiguous()
        lo, hi = torch.aminmax(tok) if tok.numel() else (tok.new_zeros(()), tok.new_zeros(()))
        if lo < 0 or hi >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab})")
        y, nr, ni = fk.fused_step(self.weights, tok, state["ssm_re"], state["ssm_im"], self._args)
        out = dict(state)
        out["ssm_re"], out["ssm_im"] = nr, ni
        return y, out

    def describe(self) -> dict:
        return {"backend": self.name, "device": "cpu", "kernel": "numba"}


def fused_supported(rec: RecurrentModel) -> str | None:
    """None when the fused backend can serve `rec`, else the reason it cannot."""
    cfg = rec.config
    if not fk.AVAILABLE:
        return "numba is not installed"
    if rec.device.type != "cpu":
        return f"the fused step is CPU-only and the model is on {rec.device}"
    if cfg.encoder == "audio":
        return None  # the fused layer block in the chunk form (`fused_audio`)
    if cfg.encoder != "tokens" or cfg.decoder != "lm":
        return "the fused step serves token language models and audio models only"
    return None


def build_fused(rec: RecurrentModel) -> Backend:
    """The fused backend of `rec`'s kind: `FusedBackend` (token LM decode step) or
    `FusedAudioBackend` (audio chunk). Raises where it cannot be built."""
    if rec.config.encoder == "audio":
        from .fused_audio import FusedAudioBackend  # noqa: PLC0415

        return FusedAudioBackend(rec)
    return FusedBackend(rec)


def make_fused(rec: RecurrentModel) -> Backend:
    """`build_fused(rec)`, or `rec` itself (logged) where the fused path cannot serve it."""
    why = fused_supported(rec)
    if why is not None:
        log.warning("fused backend unavailable (%s); using the torch step", why)
        return rec
    try:
        return build_fused(rec)
    except Exception as e:  # noqa: BLE001  (e.g. numba cannot compile or cache here)
        log.warning("fused backend failed to build (%s); using the torch step", e)
        return rec
