"""Export a recurrent DLR model as a Triton Inference Server model repository.

    OUT/
      README.md                 how to serve it with tritonserver + the ONNX Runtime backend
      <name>/config.pbtxt       sequence batcher with implicit state
      <name>/1/model.onnx       the step graph below

The step graph advances one position per sequence; Triton keeps the state between requests of a
sequence (implicit state: each `*_OUT` state output is fed back as the matching input on the
sequence's next request, and the state starts as zeros). Graph tensors (B = Triton's batch):

    inputs   TOKEN (B, 1) int64 | FRAME (B, S) float32      one token / one full audio frame
             STATE_RE, STATE_IM (B, L, H, N) float32         the complex SSM state, re / im
             [MEAN_SUM (B, H) float64, MEAN_COUNT (B, 1) float64]   classifier running mean
             [FEAT_SUM (B, F) float64, FEAT_COUNT (B, 1) float64]   feature normalisation
             [PCEN_SUM (B, M) float64, PCEN_COUNT (B, 1) float64]   PCEN's smoother (pcen.py)
             START, READY (B, 1) int32, CORRID (B, 1) uint64  sequence-batcher controls
    outputs  LOGITS (B, V) | SCORES (B, C) float32, and STATE_RE_OUT, STATE_IM_OUT, ...

The graph itself also zeroes the incoming state where START = 1 and passes the state through
unchanged where READY = 0, so it is correct whatever Triton puts in idle batch slots. CORRID is
accepted (Triton's ONNX Runtime backend requires every control input to be a model input) and
not used. Audio models take whole frames of `frame_stride` samples (each as its front-end
window when windows overlap): the client frames the audio (the README says how).
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn
from torch.export import Dim

from ..recurrent import RecurrentModel
from ..state_spec import state_spec
from .realmath import RealCore, unexportable

IDLE_TIMEOUT_US = 60_000_000  # a sequence idle for 60 s is dropped and its state freed


class TritonLMStep(nn.Module):
    """The step graph with Triton's sequence controls, LM decoder (see the module docstring)."""

    def __init__(self, core: RealCore) -> None:
        super().__init__()
        self.core = core

    def advance(self, h, state_re, state_im, start, ready):
        """Shared part: encoded input h (B, H) -> features (B, H), new state x 2 (held where
        READY = 0), keep (B, 1) (0 where a sequence starts)."""
        keep = (1 - start).to(state_re.dtype)  # (B, 1)
        k4 = keep.view(-1, 1, 1, 1)
        sr, si = state_re * k4, state_im * k4  # (B, L, H, N)
        f, nr, ni = self.core.core_step(h, sr, si)
        live = ready.view(-1, 1, 1, 1) > 0  # (B, 1, 1, 1)
        return f, torch.where(live, nr, state_re), torch.where(live, ni, state_im), keep

    def encode(self, x):
        return self.core.encode(x.squeeze(-1) if x.dtype == torch.int64 else x)  # (B, H)

    def forward(self, x, state_re, state_im, start, ready, corrid):
        del corrid  # a required control input; the math does not depend on it
        f, nr, ni, _ = self.advance(self.encode(x), state_re, state_im, start, ready)
        return self.core.head.proj(f), nr, ni


def _decayed(total, count, value, keep, ready, decay: float):
    """One step of S = a S + v, C = a C + 1 from zero where keep = 0, held where READY = 0:
    total (B, D), count (B, 1) f64 -> (new total, new count, the values before holding)."""
    k = keep.double()
    s = decay * total * k + value.double()
    c = decay * count * k + 1.0
    return torch.where(ready > 0, s, total), torch.where(ready > 0, c, count), s, c


class TritonClassifierStep(TritonLMStep):
    """The step graph with Triton's sequence controls, classifier decoder (the head's running
    mean or exponential window, `dlr_runtime.heads`)."""

    def head(self, f, mean_sum, mean_count, keep, ready):
        ms, mc, s, c = _decayed(mean_sum, mean_count, f, keep, ready, self.core.head.decay)
        return self.core.scores(s, c.squeeze(-1)), ms, mc  # (B, C), (B, H), (B, 1)

    def forward(self, x, state_re, state_im, mean_sum, mean_count, start, ready, corrid):
        del corrid
        f, nr, ni, keep = self.advance(self.encode(x), state_re, state_im, start, ready)
        y, ms, mc = self.head(f, mean_sum, mean_count, keep, ready)
        return y, nr, ni, ms, mc


class TritonFrontStateClassifierStep(TritonClassifierStep):
    """`TritonClassifierStep` of an audio model whose front end keeps a decayed sum of its
    per-frame values: two more implicit states, the sums (B, D) and counts (B, 1) float64.
    Subclasses give the decay and what the frame map reads of the values and their mean."""

    decay: float

    def features(self, values: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self, x, state_re, state_im, mean_sum, mean_count, front_sum, front_count, start, ready,
        corrid,
    ):  # fmt: skip
        del corrid
        keep = (1 - start).to(state_re.dtype)  # (B, 1)
        values = self.core.encoder.frontend(x)  # (B, D)
        fs, fc, s, c = _decayed(front_sum, front_count, values, keep, ready, self.decay)
        h = self.core.encoder.frame(self.features(values, s / c))  # (B, H)
        f, nr, ni, keep = self.advance(h, state_re, state_im, start, ready)
        y, ms, mc = self.head(f, mean_sum, mean_count, keep, ready)
        return y, nr, ni, ms, mc, fs, fc


class TritonNormClassifierStep(TritonFrontStateClassifierStep):
    """Feature normalisation (`dlr_runtime.feature_norm`): FEAT_SUM (B, F), FEAT_COUNT (B, 1);
    each front-end feature minus its causal mean."""

    def __init__(self, core: RealCore) -> None:
        super().__init__(core)
        self.decay = core.norm_decay

    def features(self, values: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return (values.double() - mean).to(values.dtype)


class TritonPcenClassifierStep(TritonFrontStateClassifierStep):
    """A PCEN front end (``pcen``, ``logmel_pcen``; `dlr_runtime.pcen`): PCEN_SUM (B, M),
    PCEN_COUNT (B, 1), the smoother of each band's mel energy."""

    def __init__(self, core: RealCore) -> None:
        super().__init__(core)
        self.decay = core.pcen.decay

    def features(self, values: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return self.core.pcen.compress(values.double(), mean).to(values.dtype)  # (B, F)


def triton_io(rec: RecurrentModel) -> dict:
    """Names, Triton types and per-sequence dims (no batch axis) of the step graph's tensors."""
    cfg = rec.config
    state_dims = [rec.n_layers, cfg.d_model, cfg.d_state]
    if cfg.encoder == "tokens":
        x = ("TOKEN", "TYPE_INT64", [1])
    else:
        x = ("FRAME", "TYPE_FP32", [cfg.window])
    y = ("LOGITS" if cfg.decoder == "lm" else "SCORES", "TYPE_FP32", [cfg.out_dim])
    states = [
        ("STATE_RE", "STATE_RE_OUT", "TYPE_FP32", state_dims),
        ("STATE_IM", "STATE_IM_OUT", "TYPE_FP32", state_dims),
    ]
    if cfg.decoder == "classifier":
        states += [
            ("MEAN_SUM", "MEAN_SUM_OUT", "TYPE_FP64", [cfg.d_model]),
            ("MEAN_COUNT", "MEAN_COUNT_OUT", "TYPE_FP64", [1]),
        ]
    spec = state_spec(cfg)  # the front end's state widths
    if cfg.encoder == "audio" and cfg.feature_norm_s:
        states += [
            ("FEAT_SUM", "FEAT_SUM_OUT", "TYPE_FP64", list(spec["feat_sum"][0])),
            ("FEAT_COUNT", "FEAT_COUNT_OUT", "TYPE_FP64", [1]),
        ]
    if cfg.has_pcen:
        states += [
            ("PCEN_SUM", "PCEN_SUM_OUT", "TYPE_FP64", list(spec["pcen_sum"][0])),
            ("PCEN_COUNT", "PCEN_COUNT_OUT", "TYPE_FP64", [1]),
        ]
    return {"input": x, "output": y, "states": states}


def _dims(d: list[int]) -> str:
    return "[ " + ", ".join(str(v) for v in d) + " ]"


def config_pbtxt(rec: RecurrentModel, name: str, max_batch_size: int, idle_us: int) -> str:
    """The model configuration (protobuf text format of Triton's ModelConfig)."""
    io = triton_io(rec)
    xn, xt, xd = io["input"]
    yn, yt, yd = io["output"]
    states = []
    for inp, out, typ, dims in io["states"]:
        states.append(
            f"""    {{
      input_name: "{inp}"
      output_name: "{out}"
      data_type: {typ}
      dims: {_dims(dims)}
      initial_state: {{ data_type: {typ} dims: {_dims(dims)} zero_data: true name: "zeros" }}
    }}"""
        )
    state_text = ",\n".join(states)
    return f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [ {{ name: "{xn}" data_type: {xt} dims: {_dims(xd)} }} ]
output [ {{ name: "{yn}" data_type: {yt} dims: {_dims(yd)} }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [
{state_text}
  ]
  oldest {{ max_candidate_sequences: {max_batch_size} max_queue_delay_microseconds: 1000 }}
}}
instance_group [ {{ count: 1 kind: KIND_AUTO }} ]
"""


def _step_module(cfg) -> type[TritonLMStep]:
    if cfg.decoder != "classifier":
        return TritonLMStep
    if cfg.has_pcen:  # (PCEN with the feature normalisation is refused: `unexportable`)
        return TritonPcenClassifierStep
    return TritonNormClassifierStep if cfg.feature_norm_s else TritonClassifierStep


def export_triton_onnx(rec: RecurrentModel, path: Path) -> Path:
    """Export the Triton step graph of `rec` (float32) to `path` and check it."""
    cfg = rec.config
    reason = unexportable(cfg)
    if reason:
        raise ValueError(reason)
    core = RealCore(rec, torch.float32, max_chunk=1)
    io = triton_io(rec)
    b = 2
    bdim = Dim("batch", min=1, max=65536)
    if cfg.encoder == "tokens":
        x = torch.randint(0, cfg.vocab_size, (b, 1))
    else:
        x = torch.randn(b, cfg.window)
    shape = (b, rec.n_layers, cfg.d_model, cfg.d_state)
    args: list[torch.Tensor] = [x, torch.randn(shape) * 0.1, torch.randn(shape) * 0.1]
    if cfg.decoder == "classifier":
        args += [torch.randn(b, cfg.d_model, dtype=torch.float64)]
        args += [torch.full((b, 1), 2.0, dtype=torch.float64)]
    spec = state_spec(cfg)
    if cfg.encoder == "audio" and cfg.feature_norm_s:
        args += [torch.randn(b, *spec["feat_sum"][0], dtype=torch.float64)]
        args += [torch.full((b, 1), 2.0, dtype=torch.float64)]
    if cfg.has_pcen:  # (sums of energies are never negative)
        args += [torch.randn(b, *spec["pcen_sum"][0], dtype=torch.float64).abs()]
        args += [torch.full((b, 1), 2.0, dtype=torch.float64)]
    args += [torch.tensor([[1], [0]], dtype=torch.int32), torch.ones(b, 1, dtype=torch.int32)]
    args += [torch.tensor([[7], [9]], dtype=torch.uint64)]
    in_names = [io["input"][0]] + [s[0] for s in io["states"]] + ["START", "READY", "CORRID"]
    out_names = [io["output"][0]] + [s[1] for s in io["states"]]
    dynamic = tuple({0: bdim} for _ in args)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        program = torch.onnx.export(
            _step_module(cfg)(core).eval(),
            tuple(args),
            dynamo=True,
            dynamic_shapes=dynamic,
            input_names=in_names,
            output_names=out_names,
            external_data=False,
            verbose=False,
        )
    program.save(str(path), external_data=False)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    have = [i.name for i in model.graph.input]
    if have != in_names:
        raise RuntimeError(f"exported Triton graph has inputs {have}, expected {in_names}")
    return path


README = """# Triton model repository for `{name}`

Generated by `dlr-export triton`. One model, `{name}`: the recurrent step of a DLR {kind}
exported to ONNX, served by Triton's ONNX Runtime backend with the sequence batcher and
implicit state, so the server keeps each sequence's state ({state_bytes} bytes per sequence)
between requests and a client sends only one {unit} per request.

## Run

    docker run --gpus=all --rm -p8000:8000 -p8001:8001 -p8002:8002 \\
        -v $PWD:/models nvcr.io/nvidia/tritonserver:<yy.mm>-py3 \\
        tritonserver --model-repository=/models

(drop `--gpus=all` on a CPU-only machine; `instance_group` is KIND_AUTO). Check
`curl localhost:8000/v2/models/{name}/ready`.

## Protocol

Every request belongs to a sequence: set `sequence_id` (any non-zero uint64, the CORRID),
`sequence_start=True` on the first request and `sequence_end=True` on the last. Inputs/outputs:

- input  `{x_name}` {x_type} dims {x_dims} (plus the batch axis): {x_desc}
- output `{y_name}` {y_type} dims {y_dims}: {y_desc}

The state tensors ({states}) are implicit: Triton zeroes them at sequence start and feeds each
`*_OUT` back as the next input; clients never send them. A sequence idle for more than
{idle_s:g} s is released. Up to {max_batch} sequences are batched per model execution.
{audio_note}
Example (Python, `pip install tritonclient[grpc]`):

    import numpy as np, tritonclient.grpc as g
    c = g.InferenceServerClient("localhost:8001")
    def send(value, seq, first=False, last=False):
        x = g.InferInput("{x_name}", [1, {x_dim0}], "{x_np}")
        x.set_data_from_numpy(np.asarray(value, dtype=np.{x_np_dtype}).reshape(1, {x_dim0}))
        r = c.infer("{name}", [x], sequence_id=seq, sequence_start=first, sequence_end=last)
        return r.as_numpy("{y_name}")[0]
"""


def export_triton(
    rec: RecurrentModel,
    out_dir: str | Path,
    name: str = "dlr",
    max_batch_size: int = 256,
    idle_us: int = IDLE_TIMEOUT_US,
) -> Path:
    """Write the model repository for `rec` under `out_dir`; returns the model directory."""
    if not name or not all(ch.isalnum() or ch in "-_" for ch in name):
        raise ValueError(f"model name must be letters, digits, '-' or '_', got {name!r}")
    if max_batch_size < 1 or idle_us < 1:
        raise ValueError("max_batch_size and idle_us must be positive")
    out = Path(out_dir)
    model_dir = out / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    export_triton_onnx(rec, model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(config_pbtxt(rec, name, max_batch_size, idle_us))
    cfg = rec.config
    io = triton_io(rec)
    audio = cfg.encoder == "audio"
    note = (
        f"\nAudio: cut the {cfg.sample_rate} Hz float32 stream into frames of "
        f"{cfg.frame_stride} samples and send each full frame; keep a partial frame on the "
        "client until it is complete. "
        + (
            f"Each FRAME is the frame's window: the {cfg.history} samples before the frame "
            f"(zeros at the start of the stream), then its {cfg.frame_stride} samples. "
            if cfg.history
            else ""
        )
        + (
            f"Each frame's front-end features have their causal mean (time constant "
            f"{cfg.feature_norm_s:g} s) subtracted inside the graph (FEAT_* states). "
            if cfg.feature_norm_s
            else ""
        )
        + (
            "Each frame's mel energies are compressed inside the graph by a per-channel energy "
            "normalisation over their causal mean (PCEN_* states)"
            + (", beside their log-mel features. " if cfg.frontend == "logmel_pcen" else ". ")
            if cfg.has_pcen
            else ""
        )
        + (
            f"Scores are those of an exponentially weighted mean of the last ~{cfg.pool_window_s:g} s "
            if cfg.pool_window_s
            else "Scores are those of the running mean over all frames so far "
        )
        + "(the argmax is the current label).\n"
    )
    labels = f" Labels (index order): {json.dumps(cfg.labels)}." if cfg.labels else ""
    text = README.format(
        name=name,
        kind="audio classifier" if audio else ("classifier" if cfg.labels else "language model"),
        state_bytes=sum(
            math.prod(d) * (8 if t == "TYPE_FP64" else 4) for _, _, t, d in io["states"]
        ),
        unit="audio frame" if audio else "token",
        x_name=io["input"][0],
        x_type=io["input"][1],
        x_dims=io["input"][2],
        x_desc="one full frame of samples" if audio else "one token id",
        y_name=io["output"][0],
        y_type=io["output"][1],
        y_dims=io["output"][2],
        y_desc=("class scores." + labels) if cfg.labels else "next-token logits",
        states=", ".join(s[0] for s in io["states"]),
        idle_s=idle_us / 1e6,
        max_batch=max_batch_size,
        audio_note=note if audio else "",
        x_dim0=io["input"][2][0],
        x_np="FP32" if audio else "INT64",
        x_np_dtype="float32" if audio else "int64",
    )
    (out / "README.md").write_text(text)
    return model_dir
