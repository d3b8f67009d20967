"""ONNX Runtime backend: the exported step/chunk graphs behind `RecurrentModel`'s interface.

`OnnxBackend` has the methods and semantics of `RecurrentModel` (`init_state`, `step`,
`chunk`, `scores`, `config`, `name`, `device`), so the engine can use it unchanged. Only the
layout of the state differs: the complex SSM state is carried as two float tensors

    "ssm_re", "ssm_im"   (B, L, H, N) float32 (or float64 for a float64 export)

next to the same "frame_buf"/"frame_fill"/"frame_hist" (audio), "feat_sum"/"feat_count"
(feature normalisation), "pcen_sum"/"pcen_count" (PCEN front end) and "mean_sum"/"mean_count"
(classifier) tensors as `RecurrentModel`
(`state_spec.split_complex`). `from_canonical` / `to_canonical` convert between the two.

State tensors are torch tensors on the backend's device and are bound to the ONNX Runtime
session by pointer (io-binding), inputs and outputs both, so with the CUDA execution provider
the state never leaves the GPU and on the CPU nothing is copied. Calls are pure: each returns
newly allocated state tensors.

Graphs (see `dlr_runtime.export.onnx_export`): `step` (one position), `chunk` (1..max_chunk
positions; longer inputs are cut into blocks here), `scores` (classifiers). Audio graphs take
whole frames' windows; the per-sample framing is the runtime's own (`dlr_runtime.framing`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from ..config import DLRConfig
from ..export.onnx_export import export_onnx, read_manifest
from ..framing import audio_chunk, audio_step
from ..recurrent import RecurrentModel
from ..state_spec import COMPLEX_OF, Spec, init_state, split_complex, state_bytes, state_spec

State = dict[str, torch.Tensor]

# float64 state tensors carried in and out of the graphs beside the complex state, by name
FLOAT64_STATES = ("mean_sum", "mean_count", "feat_sum", "feat_count", "pcen_sum", "pcen_count")
_NP_OF = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.int64: np.int64,
}


def available_providers(device: torch.device) -> list[str]:
    """Execution providers for `device`: CUDA first when on a GPU and available, then CPU."""
    have = ort.get_available_providers()
    if device.type == "cuda":
        if "CUDAExecutionProvider" not in have:
            raise RuntimeError("device is CUDA but onnxruntime has no CUDAExecutionProvider")
        return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class _Graph:
    """One ONNX Runtime session driven through io-binding with torch tensors."""

    def __init__(self, path: Path, device: torch.device, threads: int | None) -> None:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        if threads is not None:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(path), sess_options=opts, providers=available_providers(device)
        )
        self.device = device
        self.dev_type = "cuda" if device.type == "cuda" else "cpu"
        self.dev_id = device.index or 0
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(
        self, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Bind `inputs` and the preallocated `outputs` by pointer and run; returns outputs."""
        binding = self.session.io_binding()
        keep = []  # contiguous copies must outlive the run
        for name, t in inputs.items():
            t = t.contiguous()
            keep.append(t)
            binding.bind_input(
                name, self.dev_type, self.dev_id, _NP_OF[t.dtype], tuple(t.shape), t.data_ptr()
            )
        for name, t in outputs.items():
            binding.bind_output(
                name, self.dev_type, self.dev_id, _NP_OF[t.dtype], tuple(t.shape), t.data_ptr()
            )
        if self.dev_type == "cuda":
            binding.synchronize_inputs()
        self.session.run_with_iobinding(binding)
        if self.dev_type == "cuda":
            binding.synchronize_outputs()
        return outputs


class OnnxBackend:
    """A `RecurrentModel` look-alike running exported graphs in ONNX Runtime."""

    name = "onnx"

    def __init__(
        self,
        export_dir: str | Path,
        device: torch.device | str = "cpu",
        threads: int | None = None,
    ) -> None:
        man = read_manifest(export_dir)
        self.export_dir: Path | None = Path(export_dir)
        self.config = DLRConfig.from_dict(man["config"])
        self.dtype: torch.dtype = getattr(torch, man["dtype"])
        self.max_chunk = int(man["max_chunk"])
        self.n_layers = int(man["n_layers"])
        self._device = torch.device(device)
        self.graphs = {
            k: _Graph(Path(export_dir) / f, self._device, threads) for k, f in man["graphs"].items()
        }

    @classmethod
    def from_recurrent(
        cls,
        rec: RecurrentModel,
        export_dir: str | Path | None = None,
        device: torch.device | str | None = None,
        max_chunk: int = 64,
        threads: int | None = None,
    ) -> OnnxBackend:
        """Export `rec` (into `export_dir`, or a temporary directory) and load the graphs.

        The graphs' float dtype follows the state dtype of `rec` (complex64 -> float32,
        complex128 -> float64). Runs on `device` (default: rec's device). A temporary export
        directory is removed once the sessions are built (they hold the graphs in memory).
        """
        dev = rec.device if device is None else device
        if export_dir is not None:
            export_onnx(rec, export_dir, max_chunk=max_chunk)
            return cls(export_dir, device=dev, threads=threads)
        with tempfile.TemporaryDirectory(prefix="dlr-onnx-") as tmp:
            export_onnx(rec, tmp, max_chunk=max_chunk)
            backend = cls(tmp, device=dev, threads=threads)
        backend.export_dir = None  # the graphs now live only in the sessions
        return backend

    @classmethod
    def from_dir(cls, export_dir: str | Path, device: torch.device | str = "cpu") -> OnnxBackend:
        return cls(export_dir, device=device)

    # ------------------------------------------------------------------ state
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def spec(self) -> Spec:
        """This backend's state layout: the canonical one with "ssm" as re/im halves."""
        return split_complex(state_spec(self.config, COMPLEX_OF[self.dtype]))

    def init_state(self, batch: int, device: torch.device | str | None = None) -> State:
        """Zero state for `batch` streams (same keys as RecurrentModel, "ssm" as re/im)."""
        if device is not None and torch.device(device) != self._device:
            raise ValueError(f"OnnxBackend runs on {self._device}, cannot keep state on {device}")
        return init_state(self.spec, batch, self._device)

    def state_bytes(self) -> int:
        return state_bytes(self.spec)

    def state_bytes_per_session(self) -> int:
        return self.state_bytes()

    def from_canonical(self, state: State) -> State:
        """A canonical (`RecurrentModel`) state -> this backend's layout (on this device)."""
        out = {k: v.to(self._device) for k, v in state.items() if k != "ssm"}
        ssm = state["ssm"].to(self._device)
        out["ssm_re"] = ssm.real.to(self.dtype).contiguous()
        out["ssm_im"] = ssm.imag.to(self.dtype).contiguous()
        for name in ("frame_buf", "frame_hist"):
            if name in out:
                out[name] = out[name].to(self.dtype)
        return out

    def to_canonical(self, state: State, cdtype: torch.dtype | None = None) -> State:
        """This backend's state -> the canonical layout (complex of this backend's float
        dtype unless `cdtype` says otherwise)."""
        out = {k: v for k, v in state.items() if k not in ("ssm_re", "ssm_im")}
        cd = COMPLEX_OF[self.dtype] if cdtype is None else cdtype
        out["ssm"] = torch.complex(state["ssm_re"], state["ssm_im"]).to(cd)
        return out

    from_torch_state = from_canonical  # earlier names
    to_torch_state = to_canonical

    # ------------------------------------------------------------------ public API
    @torch.no_grad()
    def step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One input per stream: token ids (B,) or audio samples (B,) -> (y, new_state)."""
        self._check_batch(x_t, state, 1)
        state = dict(state)
        if self.config.encoder == "tokens":
            return self._run("step", x_t.to(self._device, torch.int64), state)
        return self._audio_step(x_t.to(self._device, self.dtype), state)

    @torch.no_grad()
    def chunk(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """A block of T inputs per stream: tokens or samples (B, T) -> (y (B, T', out), state)."""
        self._check_batch(x, state, 2)
        state = dict(state)
        if self.config.encoder == "tokens":
            return self._positions(x.to(self._device, torch.int64), state)
        return self._audio_chunk(x.to(self._device, self.dtype), state)

    @torch.no_grad()
    def scores(self, state: State) -> torch.Tensor:
        """Current class scores (B, C) of a classifier from its running mean."""
        if "scores" not in self.graphs:
            raise ValueError("scores() needs a classifier model")
        ms, mc = state["mean_sum"], state["mean_count"]
        out = torch.empty(ms.shape[0], self.config.out_dim, dtype=self.dtype, device=self._device)
        return self.graphs["scores"].run({"mean_sum": ms, "mean_count": mc}, {"scores": out})[
            "scores"
        ]

    # ------------------------------------------------------------------ graph calls
    def _check_batch(self, x: torch.Tensor, state: State, dim: int) -> None:
        if x.dim() != dim:
            raise ValueError(
                f"expected input of {dim} dims (batch first), got shape {tuple(x.shape)}"
            )
        if x.shape[0] != state["ssm_re"].shape[0]:
            raise ValueError(
                f"batch of input ({x.shape[0]}) and state ({state['ssm_re'].shape[0]}) differ"
            )
        if self.config.encoder == "tokens" and x.numel() and not x.is_floating_point():
            lo, hi = int(x.min()), int(x.max())
            if lo < 0 or hi >= self.config.vocab_size:
                raise ValueError(
                    f"token ids must be in [0, {self.config.vocab_size}), got {lo}..{hi}"
                )

    def _run(self, graph: str, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One step/chunk graph call on positions x ((B,) / (B, T) [, S]); updates `state`."""
        b = x.shape[0]
        lead = (b,) if graph == "step" else (b, x.shape[1])
        if b == 0:  # the graphs' batch axis starts at 1: nothing to run
            return torch.empty(
                *lead, self.config.out_dim, dtype=self.dtype, device=self._device
            ), state
        ins = {"x": x, "state_re": state["ssm_re"], "state_im": state["ssm_im"]}
        outs = {
            "y": torch.empty(*lead, self.config.out_dim, dtype=self.dtype, device=self._device),
            "state_re_out": torch.empty_like(state["ssm_re"]),
            "state_im_out": torch.empty_like(state["ssm_im"]),
        }
        extra = [n for n in FLOAT64_STATES if n in state]
        for name in extra:  # classifier pooling, feature normalisation, PCEN: f64 in and out
            ins[name] = state[name]
            outs[f"{name}_out"] = torch.empty_like(state[name])
        self.graphs[graph].run(ins, outs)
        state["ssm_re"], state["ssm_im"] = outs["state_re_out"], outs["state_im_out"]
        for name in extra:
            state[name] = outs[f"{name}_out"]
        return outs["y"], state

    def _positions(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """T positions ((B, T) tokens or (B, T, S) frames) in blocks of <= max_chunk."""
        b, t = x.shape[0], x.shape[1]
        if t == 0:
            return torch.zeros(
                b, 0, self.config.out_dim, dtype=self.dtype, device=self._device
            ), state
        ys = []
        for start in range(0, t, self.max_chunk):
            y, state = self._run("chunk", x[:, start : start + self.max_chunk], state)
            ys.append(y)
        return (ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)), state

    # ------------------------------------------------------------------ audio framing
    def _audio_step(self, x_t: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        def run(frames: torch.Tensor, sub: State) -> State:
            return self._run("step", frames, sub)[1]

        state = audio_step(x_t, state, self.config.frame_stride, run)
        return self.scores(state), state

    def _audio_chunk(self, x: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        return audio_chunk(x, state, self.config.frame_stride, self._positions)

    def describe(self) -> dict[str, Any]:
        """What /v1/models may report about this backend."""
        providers = self.graphs["step"].session.get_providers()
        return {
            "backend": self.name,
            "providers": providers,
            "dtype": str(self.dtype).removeprefix("torch."),
            "max_chunk": self.max_chunk,
        }
