"""Export a `RecurrentModel` to ONNX: a step graph, a chunk graph and (classifiers) a scores graph.

Layout of an export directory (what `OnnxBackend.from_dir` reads):

    manifest.json    config, float dtype, max_chunk, graph files, input/output names
    step.onnx        one position per stream           (dynamic batch)
    chunk.onnx       T positions per stream, 1 <= T <= max_chunk  (dynamic batch and T)
    scores.onnx      classifiers only: running mean -> class scores (dynamic batch)

Graph signatures (B batch, L layers, H d_model, N d_state, W frame window (`DLRConfig.window`:
frame_stride samples, plus the history before them when windows overlap), F float dtype):

    step   x (B,) int64 tokens | (B, W) F audio window, state_re, state_im (B, L, H, N) F
           [mean_sum (B, H) f64, mean_count (B,) f64]   (classifier decoder)
           [feat_sum (B, F) f64, feat_count (B,) f64]   (audio with feature normalisation)
           [pcen_sum (B, M) f64, pcen_count (B,) f64]   (audio, PCEN front end)
        -> y (B, V | C), state_re_out, state_im_out, [mean_sum_out, mean_count_out],
           [feat_sum_out, feat_count_out | pcen_sum_out, pcen_count_out]
    chunk  x (B, T) int64 | (B, T, W) F, same state     -> y (B, T, V | C), same state outputs
    scores mean_sum (B, H) f64, mean_count (B,) f64     -> scores (B, C)

The chunk's T is dynamic up to max_chunk (tables sliced in-graph, see `realmath.py`); longer
inputs are cut into blocks by the caller. Audio graphs take whole frames' windows: the sample
framing (and the history of overlapping windows) stays outside the graph. Exported with
torch.onnx.export(dynamo=True), checked with onnx.checker.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn
from torch.export import Dim

from ..config import DLRConfig
from ..recurrent import RecurrentModel
from ..state_spec import state_spec
from .realmath import (
    FLOAT_OF,
    ClassifierChunk,
    ClassifierScores,
    ClassifierStep,
    LMChunk,
    LMStep,
    NormClassifierChunk,
    NormClassifierStep,
    RealCore,
    unexportable,
)

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
STATE_IN = ["state_re", "state_im"]
STATE_OUT = ["state_re_out", "state_im_out"]
MEAN_IN = ["mean_sum", "mean_count"]
MEAN_OUT = ["mean_sum_out", "mean_count_out"]
FEAT_IN = ["feat_sum", "feat_count"]
FEAT_OUT = ["feat_sum_out", "feat_count_out"]
PCEN_IN = ["pcen_sum", "pcen_count"]
PCEN_OUT = ["pcen_sum_out", "pcen_count_out"]


def front_state(cfg: DLRConfig) -> tuple[list[str], list[str]] | None:
    """Input and output names of the front end's state in the graphs (None: it has none)."""
    if cfg.has_pcen:
        return PCEN_IN, PCEN_OUT
    if cfg.feature_norm_s:
        return FEAT_IN, FEAT_OUT
    return None


def graph_names(cfg: DLRConfig) -> dict[str, list[str]]:
    """Input and output names of the step/chunk graphs of a model."""
    ins, outs = ["x", *STATE_IN], ["y", *STATE_OUT]
    if cfg.decoder == "classifier":
        ins, outs = ins + MEAN_IN, outs + MEAN_OUT
    front = front_state(cfg)
    if front:
        ins, outs = ins + front[0], outs + front[1]
    return {"inputs": ins, "outputs": outs}


def example_inputs(
    core: RealCore, batch: int, t: int | None
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """Example arguments of the step (t=None) or chunk graph, and their dynamic shapes."""
    cfg = core.config
    bdim = Dim("batch", min=1, max=65536)
    tdim = Dim("T", min=1, max=core.max_chunk)
    lead = (batch,) if t is None else (batch, t)
    if cfg.encoder == "tokens":
        x = torch.randint(0, cfg.vocab_size, lead)
    else:
        x = torch.randn(*lead, cfg.window, dtype=core.dtype)
    x_dyn = {0: bdim} if t is None else {0: bdim, 1: tdim}
    shape = (batch, len(core.blocks), cfg.d_model, cfg.d_state)
    args: list[torch.Tensor] = [x, torch.randn(shape, dtype=core.dtype) * 0.1]
    args.append(torch.randn(shape, dtype=core.dtype) * 0.1)
    dyn: list[dict[int, Any]] = [x_dyn, {0: bdim}, {0: bdim}]
    if cfg.decoder == "classifier":
        args += [
            torch.randn(batch, cfg.d_model, dtype=torch.float64),
            torch.full((batch,), 3.0, dtype=torch.float64),
        ]
        dyn += [{0: bdim}, {0: bdim}]
    if front_state(cfg):  # (sums of energies are never negative)
        width = state_spec(cfg)["pcen_sum" if cfg.has_pcen else "feat_sum"][0]
        args += [
            torch.randn(batch, *width, dtype=torch.float64).abs(),
            torch.full((batch,), 2.0, dtype=torch.float64),
        ]
        dyn += [{0: bdim}, {0: bdim}]
    return tuple(args), {"shapes": tuple(dyn)}


def graph_modules(core: RealCore) -> tuple[nn.Module, nn.Module]:
    """The step and chunk modules exported for `core`'s model."""
    cfg = core.config
    if cfg.decoder != "classifier":
        return LMStep(core), LMChunk(core)
    if front_state(cfg):
        return NormClassifierStep(core), NormClassifierChunk(core)
    return ClassifierStep(core), ClassifierChunk(core)


def export_graph(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    dynamic: tuple[dict[int, Any], ...],
    names: dict[str, list[str]],
    path: Path,
) -> Path:
    """torch.onnx.export (dynamo) of `module` to a single self-contained file, then check it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        program = torch.onnx.export(
            module.eval(),
            args,
            dynamo=True,
            dynamic_shapes=dynamic,
            input_names=names["inputs"],
            output_names=names["outputs"],
            external_data=False,
            verbose=False,
        )
    program.save(str(path), external_data=False)
    onnx.checker.check_model(str(path), full_check=True)
    return path


def export_onnx(
    rec: RecurrentModel,
    out_dir: str | Path,
    dtype: torch.dtype | None = None,
    max_chunk: int = 64,
) -> Path:
    """Write step/chunk(/scores) graphs and a manifest for `rec` into `out_dir`; returns it.

    dtype: float dtype of the graphs (default: the real dtype of the model's state, i.e.
    float32 for complex64 and float64 for complex128).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = FLOAT_OF[rec.cdtype] if dtype is None else dtype
    reason = unexportable(rec.config)
    if reason:
        raise ValueError(reason)
    core = RealCore(rec, dtype=dtype, max_chunk=max_chunk)
    cfg = rec.config
    names = graph_names(cfg)
    clf = cfg.decoder == "classifier"
    step, chunk = graph_modules(core)
    with torch.no_grad():
        args, dyn = example_inputs(core, 2, None)
        export_graph(step, args, dyn["shapes"], names, out / "step.onnx")
        args, dyn = example_inputs(core, 2, min(3, max_chunk))
        export_graph(chunk, args, dyn["shapes"], names, out / "chunk.onnx")
        graphs = {"step": "step.onnx", "chunk": "chunk.onnx"}
        if clf:
            ms = torch.randn(2, cfg.d_model, dtype=torch.float64)
            mc = torch.full((2,), 2.0, dtype=torch.float64)
            bdim = Dim("batch", min=1, max=65536)
            score_names = {"inputs": list(MEAN_IN), "outputs": ["scores"]}
            export_graph(
                ClassifierScores(core),
                (ms, mc),
                ({0: bdim}, {0: bdim}),
                score_names,
                out / "scores.onnx",
            )
            graphs["scores"] = "scores.onnx"
    manifest = {
        "format_version": FORMAT_VERSION,
        "config": cfg.to_dict(),
        "dtype": str(dtype).removeprefix("torch."),
        "max_chunk": max_chunk,
        "n_layers": len(core.blocks),
        "graphs": graphs,
        "inputs": names["inputs"],
        "outputs": names["outputs"],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return out


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of an export directory; ValueError if it is missing or not ours."""
    p = Path(path) / MANIFEST
    if not p.is_file():
        raise ValueError(f"{path} is not an ONNX export directory (no {MANIFEST})")
    data = json.loads(p.read_text())
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{p}: unsupported format_version {data.get('format_version')!r}")
    for g in data["graphs"].values():
        if not (Path(path) / g).is_file():
            raise ValueError(f"{path}: graph file {g} listed in the manifest is missing")
    return data
