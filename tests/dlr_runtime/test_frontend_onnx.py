"""The log-mel front end, the exponential-window head, the feature normalisation and the PCEN
front end (per-band parameters drawn at random) and the union head (unknown_head.py) through ONNX
export and ONNX Runtime, against the torch recurrent form (float32 graphs: 1e-4, as in
test_onnx_backend.py; float64 graphs: 1e-7, their GELU's erf runs in float32, realmath.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from tests.dlr_runtime.test_pcen import randomise

pytest.importorskip("onnxruntime")
from dlr_runtime.backends.onnx import OnnxBackend  # noqa: E402

TOL = 1e-4
CFG = DLRConfig(
    d_model=16, d_state=8, n_layers=2, encoder="audio", decoder="classifier", frame_stride=32,
    labels=["yes", "no", "_silence_", "_unknown_"], frontend="logmel", n_mels=8,
    pool_window_s=0.01, dt_min=0.01, dt_max=0.5,
)  # fmt: skip


NORM = replace(CFG, feature_norm_s=0.05)
PCEN = replace(CFG, frontend="pcen")
BOTH = replace(CFG, frontend="logmel_pcen")
UNION = replace(CFG, unknown_classes=5)  # the last label the union of five classes


@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg, cdtype, tol",
    [
        (CFG, torch.complex64, TOL),
        (NORM, torch.complex64, TOL),
        (NORM, torch.complex128, 1e-7),
        (PCEN, torch.complex64, TOL),
        (PCEN, torch.complex128, 1e-7),
        (BOTH, torch.complex64, TOL),
        (BOTH, torch.complex128, 1e-7),
        (UNION, torch.complex64, TOL),
        (UNION, torch.complex128, 1e-7),
    ],
    ids=[
        "window",
        "feature-norm",
        "feature-norm-f64",
        "pcen",
        "pcen-f64",
        "both",
        "both-f64",
        "union",
        "union-f64",
    ],  # fmt: skip
)
def test_chunks_and_steps_match_torch(tmp_path, cfg, cdtype, tol):
    model = DLRModel(cfg, seed=3)
    if model.encoder.pcen is not None:
        randomise(model.encoder.pcen, 5)
    rec = to_recurrent(model.double() if cdtype == torch.complex128 else model, dtype=cdtype)
    be = OnnxBackend.from_recurrent(rec, tmp_path, max_chunk=8)
    assert set(be.to_canonical(be.init_state(1))) == set(rec.init_state(1))
    x = 0.3 * torch.randn(2, 32 * 30, generator=torch.Generator().manual_seed(0))
    s_ref, s_onnx = rec.init_state(2), be.init_state(2)
    for a, b in [(0, 50), (50, 50), (50, 700), (700, 32 * 28)]:
        y_ref, s_ref = rec.chunk(x[:, a:b], s_ref)
        y, s_onnx = be.chunk(x[:, a:b], s_onnx)
        assert y.shape == y_ref.shape
        if y.numel():
            assert float((y.double() - y_ref.double()).abs().max()) < tol
    for k in range(32 * 28, 32 * 30):
        y_ref, s_ref = rec.step(x[:, k], s_ref)
        y, s_onnx = be.step(x[:, k], s_onnx)
        assert float((y.double() - y_ref.double()).abs().max()) < tol
    assert float((be.scores(s_onnx).double() - rec.scores(s_ref).double()).abs().max()) < tol
