"""Torch fast path: the decode step compiled (CPU) or captured in CUDA graphs (GPU).

`FastTorchBackend` wraps a `RecurrentModel` and keeps its state layout and semantics exactly
(same state dict, "ssm" complex), so sessions move freely between the two. Only the token step
(`step` of a tokens model) takes a fast path; everything else (chunk, audio, scores) is the
wrapped model's own code.

The fast step runs the real-arithmetic twin (`dlr_runtime.export.realmath.RealCore`) on a
zero-copy real view of the complex state (`torch.view_as_real`, (B, L, H, N, 2)):

- CUDA: one CUDA graph per batch size, captured on first use (or by `capture(batch_sizes)`):
  static input/state buffers, a token costs two small copies and one graph replay; no host
  sync inside the step.
- CPU: `torch.compile` of the same function (static shapes, one compile per batch size), used
  for batch sizes where it measured faster than eager; `calibrate(batch)` decides per batch
  size and any compile failure falls back to eager for good.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ..export.realmath import FLOAT_OF, RealCore
from ..recurrent import RecurrentModel
from .timing import per_call_seconds

State = dict[str, torch.Tensor]
log = logging.getLogger(__name__)


class _Stepper(torch.nn.Module):
    """tokens (B,), ssm (B, L, H, N, 2) real view -> logits (B, V), new ssm (B, L, H, N, 2)."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, tokens: torch.Tensor, ssm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f, nr, ni = self.core.core_step(self.core.encode(tokens), ssm[..., 0], ssm[..., 1])
        return self.core.head.proj(f), torch.stack([nr, ni], dim=-1)


class _CudaGraphStep:
    """One captured step for a fixed batch size (static buffers, replay per call)."""

    def __init__(self, stepper: _Stepper, batch: int, ssm_shape: tuple, device) -> None:
        dtype = stepper.core.dtype
        self.tokens = torch.zeros(batch, dtype=torch.int64, device=device)
        self.ssm = torch.zeros(batch, *ssm_shape, 2, dtype=dtype, device=device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm up outside the graph (allocator, kernels)
            for _ in range(2):
                stepper(self.tokens, self.ssm)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.y, self.new = stepper(self.tokens, self.ssm)

    def __call__(
        self, tokens: torch.Tensor, ssm: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.tokens.copy_(tokens)
        self.ssm.copy_(ssm)
        self.graph.replay()
        return self.y.clone(), self.new.clone()


class FastTorchBackend:
    """`RecurrentModel` semantics with a compiled / graph-captured token step."""

    name = "torch-fast"

    def __init__(self, rec: RecurrentModel, compile_cpu: bool = True) -> None:
        self.rec = rec
        self.config = rec.config
        core = RealCore(rec, FLOAT_OF[rec.cdtype], max_chunk=1)
        core.f32_erf = False  # torch has a float64 erf: keep float64 models exact
        self.stepper = _Stepper(core).to(rec.device)
        self.compile_cpu = compile_cpu
        self._graphs: dict[int, _CudaGraphStep] = {}
        self._compiled: Callable | None = None
        self._use_compiled: dict[int, bool] = {}  # CPU: batch size -> compiled was faster
        self._compile_broken = False

    @classmethod
    def from_recurrent(cls, rec: RecurrentModel, **options) -> FastTorchBackend:
        return cls(rec, **options)

    # ------------------------------------------------------------------ delegated API
    @property
    def device(self) -> torch.device:
        return self.rec.device

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        return self.rec.init_state(batch, device)

    def state_bytes(self) -> int:
        return self.rec.state_bytes()

    def state_bytes_per_session(self) -> int:
        return self.state_bytes()

    def to_canonical(self, state: State) -> State:
        return state  # the wrapped model's layout

    def from_canonical(self, state: State) -> State:
        return self.rec.from_canonical(state)

    def chunk(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        return self.rec.chunk(x, state)

    def scores(self, state: State) -> torch.Tensor:
        return self.rec.scores(state)

    # ------------------------------------------------------------------ the fast step
    @torch.no_grad()
    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        cfg = self.config
        if cfg.encoder != "tokens" or cfg.decoder != "lm":
            return self.rec.step(x_t, state)
        if x_t.dim() != 1 or x_t.shape[0] != state["ssm"].shape[0]:
            raise ValueError(
                f"step needs tokens (B,) matching the state's batch, got {tuple(x_t.shape)}"
            )
        if x_t.numel() and (int(x_t.min()) < 0 or int(x_t.max()) >= cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {cfg.vocab_size})")
        fn = self._step_fn(x_t.shape[0])
        y, new = fn(x_t.to(self.device), torch.view_as_real(state["ssm"]))
        out = dict(state)
        out["ssm"] = torch.view_as_complex(new)
        return y, out

    def _step_fn(self, batch: int) -> Callable:
        if self.device.type == "cuda":
            if batch not in self._graphs:
                self.capture([batch])
            return self._graphs[batch]
        if self.compile_cpu and not self._compile_broken:
            if batch not in self._use_compiled:
                self.calibrate(batch)
            if self._use_compiled.get(batch):
                return self._compiled
        return self.stepper

    def capture(self, batch_sizes: list[int]) -> None:
        """CUDA: capture the step graph for each batch size now (first call otherwise)."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graph capture needs the model on a CUDA device")
        cfg = self.config
        shape = (self.rec.n_layers, cfg.d_model, cfg.d_state)
        with torch.no_grad():
            for b in batch_sizes:
                if b not in self._graphs:
                    self._graphs[b] = _CudaGraphStep(self.stepper, b, shape, self.device)

    def calibrate(self, batch: int, reps: int = 20) -> bool:
        """CPU: time eager vs compiled step at `batch`; remember and return whether compiled won."""
        try:
            if self._compiled is None:
                self._compiled = torch.compile(self.stepper, dynamic=False, fullgraph=True)
            tok = torch.zeros(batch, dtype=torch.int64, device=self.device)
            ssm = torch.view_as_real(self.rec.init_state(batch)["ssm"])
            with torch.no_grad():
                self._compiled(tok, ssm)  # compiles for this shape
                t_eager = per_call_seconds(lambda: self.stepper(tok, ssm), reps)
                t_comp = per_call_seconds(lambda: self._compiled(tok, ssm), reps)
        except Exception as e:  # any compiler failure: eager from now on
            log.warning("torch.compile of the decode step failed (%s); using eager", e)
            self._compile_broken = True
            return False
        self._use_compiled[batch] = t_comp < 0.9 * t_eager
        log.info(
            "decode step at batch %d: eager %.1f us, compiled %.1f us -> %s",
            batch,
            t_eager * 1e6,
            t_comp * 1e6,
            "compiled" if self._use_compiled[batch] else "eager",
        )
        return self._use_compiled[batch]

    def describe(self) -> dict:
        return {
            "backend": self.name,
            "device": str(self.device),
            "cuda_graph_batches": sorted(self._graphs),
            "compiled_batches": sorted(b for b, v in self._use_compiled.items() if v),
        }
