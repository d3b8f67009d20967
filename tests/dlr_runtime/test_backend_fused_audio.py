"""The fused audio chunk (`backends.fused_block.ssm_block`, numba) against its plain twin, the
torch chunk form, the step loop and the offline (FFT convolution) network.

Tolerances: the layer block alone float64 1e-10, float32 1e-5 (absolute; outputs ~1-10). The
whole network relative to its output scale, as in test_frontend: float64 1e-10, float32 1e-4.
Batching is checked bit for bit: each (session, feature) row is computed alone.
"""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends import fused_block as fb
from dlr_runtime.backends import fused_kernel as fk
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from tests.dlr_runtime.test_backend_engine import same_audio_results

pytestmark = pytest.mark.skipif(not fb.AVAILABLE, reason="numba is not installed")
from dlr_runtime.backends.fused_audio import FusedAudioBackend  # noqa: E402

BLOCK_TOL = {torch.complex64: 1e-5, torch.complex128: 1e-10}
NET_TOL = {torch.complex64: 1e-4, torch.complex128: 1e-10}
LABELS = ["yes", "no", "_silence_", "_unknown_"]
VARIANTS = {  # B = 1 (DLR) or a learnt B (S4D), shared or per-feature lambda, front ends
    "dlr-logmel-window": {"frontend": "logmel", "pool_window_s": 0.02},
    "dlr-raw-mean": {"frontend": "raw", "shared_lambda": False},
    "s4d-logmel": {"layer": "s4d", "frontend": "logmel", "glu": False},
    "dlr-logmel-featnorm": {"frontend": "logmel", "pool_window_s": 0.02, "feature_norm_s": 0.03},
    "dlr-pcen-window": {"frontend": "pcen", "pool_window_s": 0.02},
    "dlr-logmel-pcen-window": {"frontend": "logmel_pcen", "pool_window_s": 0.02},
}


def _config(**over) -> DLRConfig:
    base = dict(
        d_model=8, d_state=6, n_layers=2, encoder="audio", decoder="classifier", labels=LABELS,
        frame_stride=40, frontend="logmel", n_mels=10, pool_window_s=0.0, dt_min=0.01,
        dt_max=0.5, sample_rate=16000,
    )  # fmt: skip
    return DLRConfig(**{**base, **over})


def _model(cdtype: torch.dtype, **over) -> tuple[DLRModel, torch.nn.Module]:
    model = DLRModel(_config(**over), seed=2).eval()
    if cdtype == torch.complex128:
        model = model.double()
    return model, to_recurrent(model, dtype=cdtype)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max()) if a.numel() else 0.0


def _audio(batch: int, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (0.3 * torch.randn(batch, n, generator=g, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("cdtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("t", [1, 5, 23])
@pytest.mark.parametrize("with_b", [False, True])
def test_block_matches_its_plain_twin(cdtype, t, with_b):
    rd = torch.float32 if cdtype == torch.complex64 else torch.float64
    g = torch.Generator().manual_seed(t)
    h, n, bsz, layers = 7, 5, 3, 2
    mag = 0.5 + 0.49 * torch.rand(h, n, generator=g, dtype=torch.float64)
    lam = torch.polar(mag, 3 * torch.rand(h, n, generator=g, dtype=torch.float64)).to(cdtype)
    c = torch.randn(h, n, generator=g, dtype=torch.complex128).to(cdtype)
    b = torch.randn(h, n, generator=g, dtype=torch.complex128).to(cdtype) if with_b else None
    d = torch.randn(h, generator=g, dtype=torch.float64).to(rd)
    u = torch.randn(bsz, t, h, generator=g, dtype=torch.float64).to(rd)
    state = torch.randn(bsz, layers, h, n, generator=g, dtype=torch.complex128).to(cdtype)
    before = state.clone()
    out = torch.zeros_like(state)
    w = fb.layer_planes(lam, c, d, b, rd)
    y, x_end = fb.ssm_block(u, state[:, 1], w, out=out[:, 1])  # views, as the chunk form passes
    y_ref, x_ref = fb.ssm_block_ref(u, state[:, 1], lam, c, d, b)
    assert y.dtype == rd and y.shape == (bsz, t, h)
    assert x_end.data_ptr() == out[:, 1].data_ptr()  # written into `out`
    assert (y - y_ref).abs().max().item() < BLOCK_TOL[cdtype]
    assert (out[:, 1] - x_ref).abs().max().item() < BLOCK_TOL[cdtype]
    assert torch.equal(state, before) and torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))


@pytest.mark.parametrize("cdtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_chunks_equal_offline_torch_chunks_and_steps(cdtype, variant):
    model, rec = _model(cdtype, **VARIANTS[variant])
    be = FusedAudioBackend(rec)
    x = _audio(2, 40 * 60, rec.rdtype)
    with torch.no_grad():
        ref = model(x)  # (2, 60, C): the offline FFT-convolution network
    scale = float(ref.abs().max())
    tol = NET_TOL[cdtype] * scale
    # chunks at cuts misaligned with frames (0, 1, 5 and 23 frames per call)
    st_f, st_t, outs, prev = be.init_state(2), rec.init_state(2), [], 0
    for cut in [7, 47, 247, 1167, 1200, 2400]:
        yf, st_f = be.chunk(x[:, prev:cut], st_f)
        yt, st_t = rec.chunk(x[:, prev:cut], st_t)
        assert _diff(yf, yt) <= tol
        outs.append(yf)
        prev = cut
    assert float((torch.cat(outs, 1) - ref).abs().max()) <= tol
    for k in st_t:
        assert _diff(st_f[k], st_t[k]) <= tol, k
    # the per-sample step loop continues from the fused chunk's state
    xs = _audio(2, 80, rec.rdtype, seed=1)
    sa, sb = dict(st_f), dict(st_t)
    for i in range(80):
        ya, sa = be.step(xs[:, i], sa)
        yb, sb = rec.step(xs[:, i], sb)
    assert _diff(ya, yb) <= tol
    assert torch.allclose(be.scores(st_f), ref[:, -1], atol=tol)


def test_batching_never_changes_a_stream_output():
    """The layer block bit for bit; the network within float32 rounding (its front end and
    linear layers are batched matmuls, as in the torch backend)."""
    _, rec = _model(torch.complex64)
    be = FusedAudioBackend(rec)
    g = torch.Generator().manual_seed(4)
    u = torch.randn(5, 6, 8, generator=g)
    x0 = torch.randn(5, 8, 6, generator=g, dtype=torch.complex64)
    y_all, x_all = fb.ssm_block(u, x0, be.layers[0])
    for r in range(5):
        y_one, x_one = fb.ssm_block(u[r : r + 1], x0[r : r + 1], be.layers[0])
        assert torch.equal(y_all[r], y_one[0]) and torch.equal(x_all[r], x_one[0])
    x = _audio(5, 200, torch.float32, seed=3)
    y_all, _ = be.chunk(x, be.init_state(5))
    for r in range(5):
        y_one, _ = be.chunk(x[r : r + 1], be.init_state(1))
        assert _diff(y_all[r], y_one[0]) < 1e-5


def test_engine_on_fused_audio_equals_torch():
    _, rec = _model(torch.complex64)
    a, b = Engine(rec, "speech", 4), Engine(make_backend(rec, "fused"), "speech", 4)
    assert b.backend.name == "fused" and isinstance(b.backend, FusedAudioBackend)
    _, sb = same_audio_results(a, b, atol=1e-5)
    blob = b.snapshot(sb[0])  # snapshots carry the canonical layout: they move to torch
    s_new = a.open()
    a.restore(s_new, blob)
    assert torch.equal(a.pool.row(s_new)["ssm"], b.pool.row(sb[0])["ssm"])


def test_falls_back_to_torch_without_numba(monkeypatch):
    _, rec = _model(torch.complex64)
    monkeypatch.setattr(fk, "AVAILABLE", False)
    assert make_backend(rec, "fused") is rec
    monkeypatch.setattr(fb, "AVAILABLE", False)
    with pytest.raises(RuntimeError, match="numba"):
        FusedAudioBackend(rec)
