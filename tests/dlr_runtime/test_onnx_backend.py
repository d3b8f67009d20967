"""ONNX export and the ONNX Runtime backend against the torch reference (RecurrentModel).

Tolerances (max abs difference of outputs/state, unit-scale random models):
- float32 graphs vs complex64 RecurrentModel: 1e-4 (step and chunk; the chunk's Toeplitz/
  Vandermonde sums round differently from the step loop, ~1e-6 in practice).
- float64 graphs vs complex128 RecurrentModel: 1e-6 (GELU's erf is evaluated in float32 inside
  float64 graphs, since ONNX Runtime has no float64 Erf; everything else is float64).
Exports are made once per module (each takes a few seconds); the audio model goes through the
`dlr-export onnx` command and `OnnxBackend.from_dir`.
"""

from __future__ import annotations

from dataclasses import replace

import onnx
import pytest
import torch

from dlr_runtime import (
    DLRConfig,
    DLRModel,
    load_recurrent,
    reference_forward,
    save_checkpoint,
    to_recurrent,
)
from dlr_runtime.backends.onnx import OnnxBackend
from dlr_runtime.export.cli import main as export_main
from dlr_runtime.export.onnx_export import read_manifest
from dlr_runtime.export.realmath import ClassifierChunk, LMChunk, LMStep, RealCore
from dlr_runtime.model import frames_of

# ONNX export of every graph (~1-2 min on 2 cores): full suite only
pytestmark = pytest.mark.slow

LM_CFG = DLRConfig.preset("tiny-lm", vocab_size=20, init="omega")
AUDIO_CFG = DLRConfig.preset(
    "tiny-speech", frame_stride=4, labels=["a", "b", "c"], shared_lambda=False, norm="rmsnorm"
)
# overlapping log-mel windows: each frame's 4 samples after the 6 before them (history in state)
WINDOW_CFG = replace(AUDIO_CFG, frame_window=10, frontend="logmel", n_mels=3)
TOL = {torch.complex64: 1e-4, torch.complex128: 1e-6}


@pytest.fixture(scope="module")
def lm_model() -> DLRModel:
    return DLRModel(LM_CFG, seed=1)


@pytest.fixture(scope="module", params=[torch.complex64, torch.complex128], ids=["f32", "f64"])
def lm(request, lm_model, tmp_path_factory):
    rec = to_recurrent(lm_model, request.param)
    be = OnnxBackend.from_recurrent(rec, tmp_path_factory.mktemp("lm"), max_chunk=8)
    return rec, be


@pytest.fixture(scope="module", params=[AUDIO_CFG, WINDOW_CFG], ids=["frame", "window"])
def audio(request, tmp_path_factory):
    """Audio classifier exported through the `dlr-export onnx` command, loaded with from_dir:
    raw frames, and overlapping log-mel windows (the matmul DFT inside the graph)."""
    tmp = tmp_path_factory.mktemp("audio")
    model = DLRModel(request.param, seed=2)
    save_checkpoint(model, tmp / "ckpt")
    assert export_main(["onnx", str(tmp / "ckpt"), str(tmp / "g"), "--max-chunk", "8"]) == 0
    be = OnnxBackend.from_dir(tmp / "g")
    assert be.max_chunk == 8
    return model, load_recurrent(tmp / "ckpt"), be


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    assert a.shape == b.shape
    if a.is_complex() or b.is_complex():
        diff = a.to(torch.complex128) - b.to(torch.complex128)
    else:
        diff = a.double() - b.double()
    err = diff.abs().max().item() if a.numel() else 0.0
    assert err <= tol, f"max abs error {err:.3g} > {tol}"


def _check_state(be: OnnxBackend, s_onnx: dict, s_ref: dict, tol: float) -> None:
    conv = be.to_torch_state(s_onnx, s_ref["ssm"].dtype)
    assert set(conv) == set(s_ref)
    for k in s_ref:
        if k == "frame_fill":
            assert torch.equal(conv[k], s_ref[k])
        else:
            _close(conv[k], s_ref[k], tol)


# ---------------------------------------------------------------------- real-arithmetic twin
@pytest.mark.parametrize("cdtype", [torch.complex64, torch.complex128])
def test_real_twin_matches_recurrent(lm_model, cdtype):
    rec = to_recurrent(lm_model, cdtype)
    core = RealCore(rec, torch.float32 if cdtype == torch.complex64 else torch.float64, 8)
    assert all(core.b_is_one)  # DLR layers: the B = 1 path
    state = rec.init_state(3)
    state["ssm"] = torch.randn_like(state["ssm"]) * 0.3
    re, im = state["ssm"].real.to(core.dtype), state["ssm"].imag.to(core.dtype)
    x = torch.randint(0, 20, (3, 8))
    y_ref, s_ref = rec.chunk(x, state)
    y, r, i = LMChunk(core)(x, re, im)
    _close(y, y_ref, TOL[cdtype])
    _close(torch.complex(r, i), s_ref["ssm"], TOL[cdtype])
    y_ref, s_ref = rec.step(x[:, 0], state)
    y, r, i = LMStep(core)(x[:, 0], re, im)
    _close(y, y_ref, TOL[cdtype])
    _close(torch.complex(r, i), s_ref["ssm"], TOL[cdtype])


@pytest.mark.parametrize("layer", ["s4d", "lru"])
def test_real_twin_general_input_vector(layer):
    """Layers whose B is not 1 (S4D, LRU) take the general complex-B path of the twin."""
    cfg = DLRConfig.preset("micro-lm", layer=layer)
    rec = to_recurrent(DLRModel(cfg, seed=0))
    core = RealCore(rec, torch.float32, 8)
    assert not any(core.b_is_one)
    state = rec.init_state(2)
    state["ssm"] = torch.randn_like(state["ssm"]) * 0.3
    re, im = state["ssm"].real, state["ssm"].imag
    x = torch.randint(0, 20, (2, 6))
    for mod, xx in ((LMChunk(core), x), (LMStep(core), x[:, 0])):
        y, r, i = mod(xx, re, im)
        y_ref, s_ref = (rec.chunk if xx.dim() == 2 else rec.step)(xx, state)
        _close(y, y_ref, 1e-5)
        _close(torch.complex(r, i), s_ref["ssm"], 1e-5)


def test_real_twin_rejects_bad_settings(lm_model):
    rec = to_recurrent(lm_model)
    with pytest.raises(ValueError, match="dtype"):
        RealCore(rec, torch.float16)
    with pytest.raises(ValueError, match="max_chunk"):
        RealCore(rec, max_chunk=0)


# ---------------------------------------------------------------------- export
def _check_graphs(be: OnnxBackend) -> None:
    man = read_manifest(be.export_dir)
    for g in man["graphs"].values():
        model = onnx.load(str(be.export_dir / g))
        onnx.checker.check_model(model, full_check=True)
        dims = model.graph.input[0].type.tensor_type.shape.dim
        assert dims[0].dim_param, "batch axis must be dynamic"


# one fixture per test, so that each parametrised export is made once per module
def test_exported_lm_graphs_pass_checker(lm):
    _check_graphs(lm[1])


def test_exported_audio_graphs_pass_checker(audio):
    _check_graphs(audio[2])


def test_export_cli_bad_checkpoint(tmp_path, capsys):
    assert export_main(["onnx", str(tmp_path / "nope"), str(tmp_path / "g")]) == 2
    assert "cannot load checkpoint" in capsys.readouterr().err


def test_read_manifest_errors(tmp_path):
    with pytest.raises(ValueError, match="not an ONNX export"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format_version": 99}')
    with pytest.raises(ValueError, match="format_version"):
        read_manifest(tmp_path)


# ---------------------------------------------------------------------- LM parity
def test_lm_step_parity(lm):
    rec, be = lm
    tol = TOL[rec.cdtype]
    gen = torch.Generator().manual_seed(0)
    s_ref, s_onnx = rec.init_state(4), be.init_state(4)
    for _ in range(12):
        tok = torch.randint(0, 20, (4,), generator=gen)
        y_ref, s_ref = rec.step(tok, s_ref)
        y, s_onnx = be.step(tok, s_onnx)
        _close(y, y_ref, tol)
    _check_state(be, s_onnx, s_ref, tol)


@pytest.mark.parametrize("t", [0, 1, 5, 8, 9, 17])
def test_lm_chunk_parity_any_length(lm, t):
    rec, be = lm
    tol = TOL[rec.cdtype]
    x0 = torch.randint(0, 20, (3, 6))
    s_ref, s_onnx = rec.chunk(x0, rec.init_state(3))[1], be.chunk(x0, be.init_state(3))[1]
    x = torch.randint(0, 20, (3, t))
    y_ref, s_ref = rec.chunk(x, s_ref)
    y, s_onnx = be.chunk(x, s_onnx)
    _close(y, y_ref, tol)
    _check_state(be, s_onnx, s_ref, tol)


def test_lm_dynamic_batch_and_reference(lm, lm_model):
    rec, be = lm
    x = torch.randint(0, 20, (5, 11))
    ref = reference_forward(lm_model, x)  # (5, 11, V) float64, the specification
    y, _ = be.chunk(x, be.init_state(5))
    _close(y, ref, 1e-4)
    y1, _ = be.chunk(x[:1], be.init_state(1))
    _close(y1, ref[:1], 1e-4)


def test_state_moves_between_backends(lm):
    rec, be = lm
    x = torch.randint(0, 20, (2, 10))
    _, s = be.chunk(x[:, :4], be.init_state(2))
    y_mixed, _ = rec.chunk(x[:, 4:], be.to_torch_state(s, rec.cdtype))
    y_ref, _ = rec.chunk(x, rec.init_state(2))
    _close(y_mixed, y_ref[:, 4:], TOL[rec.cdtype])
    s2 = be.from_torch_state(rec.chunk(x[:, :4], rec.init_state(2))[1])
    _close(be.chunk(x[:, 4:], s2)[0], y_ref[:, 4:], TOL[rec.cdtype])


def test_lm_bad_input(lm):
    _, be = lm
    state = be.init_state(2)
    with pytest.raises(ValueError, match="batch"):
        be.step(torch.zeros(3, dtype=torch.int64), state)
    with pytest.raises(ValueError, match="dims"):
        be.chunk(torch.zeros(2, dtype=torch.int64), state)
    with pytest.raises(ValueError, match="token ids"):
        be.step(torch.tensor([0, 20]), state)
    with pytest.raises(ValueError, match="classifier"):
        be.scores(state)


def test_empty_batch(lm):
    _, be = lm
    y, s = be.chunk(torch.zeros(0, 3, dtype=torch.int64), be.init_state(0))
    assert y.shape == (0, 3, 20) and s["ssm_re"].shape[0] == 0
    y, _ = be.step(torch.zeros(0, dtype=torch.int64), be.init_state(0))
    assert y.shape == (0, 20)


def test_backend_attributes(lm):
    rec, be = lm
    assert be.name == "onnx"
    assert be.config == rec.config
    assert be.device == torch.device("cpu")
    assert be.state_bytes_per_session() == rec.state_bytes_per_session()
    assert "CPUExecutionProvider" in be.describe()["providers"]


# ---------------------------------------------------------------------- audio classifier
def test_audio_chunks_and_steps(audio):
    model, rec, be = audio
    tol = TOL[torch.complex64]
    x = torch.randn(3, 61)
    s_ref, s_onnx = rec.init_state(3), be.init_state(3)
    for a, b in [(0, 7), (7, 7), (7, 45), (45, 46)]:  # partial frame, empty, many frames, 1 sample
        y_ref, s_ref = rec.chunk(x[:, a:b], s_ref)
        y, s_onnx = be.chunk(x[:, a:b], s_onnx)
        _close(y, y_ref, tol)
        _check_state(be, s_onnx, s_ref, tol)
    for k in range(46, 61):  # per-sample steps across frame boundaries
        y_ref, s_ref = rec.step(x[:, k], s_ref)
        y, s_onnx = be.step(x[:, k], s_onnx)
        _close(y, y_ref, tol)
    _check_state(be, s_onnx, s_ref, tol)
    _close(be.scores(s_onnx), rec.scores(s_ref), tol)
    full = reference_forward(model, x)  # (3, 15, C)
    _close(be.chunk(x, be.init_state(3))[0], full, tol)


def test_audio_rows_at_different_offsets(audio):
    _, rec, be = audio
    tol = TOL[torch.complex64]
    x = torch.randn(2, 20)

    def offsets(m):  # row 0 one sample into a frame, row 1 three samples
        s0 = m.chunk(x[:1, :1], m.init_state(1))[1]
        s1 = m.chunk(x[1:, :3], m.init_state(1))[1]
        return {k: torch.cat([s0[k], s1[k]]) for k in s0}

    s_ref, s_onnx = offsets(rec), offsets(be)
    assert s_onnx["frame_fill"].tolist() == [1, 3]
    y_ref, s_ref = rec.chunk(x[:, 3:10], s_ref)  # 7 more samples: both rows complete 2 frames
    y, s_onnx = be.chunk(x[:, 3:10], s_onnx)
    _close(y, y_ref, tol)
    _check_state(be, s_onnx, s_ref, tol)
    with pytest.raises(ValueError, match="different numbers of frames"):
        be.chunk(x[:, :2], s_onnx)


def test_classifier_chunk_twin(audio):
    _, rec, be = audio
    core = RealCore(rec, torch.float32, 8)
    state = rec.init_state(2)
    x = torch.randn(2, 20)
    frames = frames_of(x, 4, rec.config.history)  # (2, 5, W)
    y_ref, s_ref = rec.chunk(x, state)
    y, r, i, ms, mc = ClassifierChunk(core)(
        frames, state["ssm"].real, state["ssm"].imag, state["mean_sum"], state["mean_count"]
    )
    _close(y, y_ref, 1e-5)
    _close(ms, s_ref["mean_sum"], 1e-5)
    assert mc.tolist() == [5.0, 5.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_execution_provider_keeps_state_on_device(lm_model, tmp_path):
    rec = to_recurrent(lm_model).to("cuda")
    be = OnnxBackend.from_recurrent(rec, tmp_path, max_chunk=8)
    assert be.describe()["providers"][0] == "CUDAExecutionProvider"
    x = torch.randint(0, 20, (3, 13), device="cuda")
    y, s = be.chunk(x, be.init_state(3))
    assert y.is_cuda and all(t.is_cuda for t in s.values())
    y_ref, _ = rec.chunk(x, rec.init_state(3))
    _close(y.cpu(), y_ref.cpu(), 1e-4)
