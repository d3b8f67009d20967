"""The PCEN front end (`dlr_runtime.pcen`) in every form of the runtime.

- offline == chunk == step == the plain loop with the paper's initial values: in
  test_frontend.py with every head (float64 1e-10, float32 1e-4); here with per-band
  parameters drawn at random, so a band mixed up with another would show;
- `PCEN.chunk` against a loop of `PCEN.step`, across pooling blocks;
- what it is for: a gain change of the microphone barely moves the features (alpha near 1),
  and stationary noise is compressed to about the same level whatever its loudness;
- the state layout, snapshots (mid-frame round trip, impossible values refused), the config's
  round trip and refusals, and the exported graphs: ONNX and Triton's (their agreement with
  torch is in test_frontend_onnx.py and test_triton_export.py), none yet for PCEN with the
  feature normalisation.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, load_recurrent, reference_forward, save_checkpoint
from dlr_runtime.backends import make_backend
from dlr_runtime.backends.autoselect import default_candidates
from dlr_runtime.engine import Engine
from dlr_runtime.export.onnx_export import export_onnx, graph_names
from dlr_runtime.export.triton import export_triton_onnx
from dlr_runtime.pcen import INIT_DELTA, INIT_R, PCEN, pcen_decay
from dlr_runtime.recurrent import to_recurrent
from dlr_runtime.state_spec import state_bytes, state_spec
from tests.dlr_runtime.snapshot_checks import mid_frame_round_trip, refuses_bad_values
from tests.dlr_runtime.test_frontend import F64_TOL, LABELS, audio, streamed


def config(**over) -> DLRConfig:
    base = dict(
        d_model=8, d_state=6, n_layers=2, encoder="audio", decoder="classifier", labels=LABELS,
        frame_stride=40, frontend="pcen", n_mels=10, pool_window_s=0.01, dt_min=0.01,
        dt_max=0.5, sample_rate=16000,
    )  # fmt: skip
    return DLRConfig(**{**base, **over})


def randomise(pcen: PCEN, seed: int) -> None:
    """Per-band parameters away from their shared initial values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (pcen.log_alpha, pcen.log_delta, pcen.log_r):
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def test_chunk_equals_a_loop_of_steps():
    pcen = PCEN(5, 0.97).double()
    randomise(pcen, 0)
    g = torch.Generator().manual_seed(1)
    e = torch.rand(3, 300, 5, generator=g, dtype=torch.float64) * 10  # longer than a block
    s0 = torch.rand(3, 5, generator=g, dtype=torch.float64)
    c0 = torch.tensor([0.0, 1.0, 7.5], dtype=torch.float64)
    with torch.no_grad():
        got, s_end, c_end = pcen.chunk(e, s0, c0)
        s, c, want = s0, c0, []
        for t in range(e.shape[1]):
            y, s, c = pcen.step(e[:, t], s, c)
            want.append(y)
        assert torch.allclose(got, torch.stack(want, 1), atol=1e-12)
        assert torch.allclose(s_end, s, atol=1e-10) and torch.allclose(c_end, c, atol=1e-12)
        # offline from an empty state == chunk from zeros
        zeros = torch.zeros(3, 5, dtype=torch.float64)
        assert torch.allclose(pcen(e), pcen.chunk(e, zeros, torch.zeros(3))[0], atol=1e-12)


@pytest.mark.parametrize("frontend", ["pcen", "logmel_pcen"])
def test_per_band_parameters_in_every_form_float64(frontend):
    model = DLRModel(config(frontend=frontend), seed=0).double().eval()
    randomise(model.encoder.pcen, 3)
    rec = to_recurrent(model, dtype=torch.complex128, max_block=16)
    x = audio(2, 40 * 70)
    with torch.no_grad():
        ref = model(x)
    scale = ref.abs().max()
    assert float((reference_forward(model, x) - ref).abs().max() / scale) < F64_TOL
    for cuts, steps_from in (([], None), ([7, 333, 334, 1201], None), ([13, 900], 2400)):
        out = streamed(rec, x, cuts, steps_from)
        assert float((out - ref).abs().max() / scale) < F64_TOL


def test_gain_barely_moves_the_features_and_noise_is_compressed():
    pcen = PCEN(4, math.exp(-0.02 / 0.4)).double()
    g = torch.Generator().manual_seed(2)
    e = torch.rand(1, 200, 4, generator=g, dtype=torch.float64) * 5 + 0.1
    with torch.no_grad():
        base = pcen(e)
        for k in (0.01, 100.0):  # -40 / +40 dB: log-mel would shift by log(k)
            assert float((pcen(k * e) - base).abs().max()) < 0.1 * float(base.abs().max())
        pcen.log_alpha.zero_()  # alpha = 1: exactly gain-free while energies >> eps
        assert torch.allclose(pcen(1e3 * e), pcen(e), atol=1e-6)
        # stationary energy at any level -> sqrt(1 + delta) - sqrt(delta) once smoothed
        flat = torch.ones(1, 50, 4, dtype=torch.float64)
        want = (1 + INIT_DELTA) ** INIT_R - INIT_DELTA**INIT_R
        for level in (1e-3, 1.0, 1e3):
            assert torch.allclose(pcen(level * flat), torch.full_like(flat, want), atol=1e-3)


def test_state_layout_size_and_config():
    cfg = config()
    spec = state_spec(cfg, torch.complex64)
    assert spec["pcen_sum"] == ((cfg.n_mels,), torch.float64)
    assert spec["pcen_count"] == ((), torch.float64)
    assert state_bytes(spec) - state_bytes(state_spec(config(frontend="logmel"))) == 8 * 11
    assert cfg.feature_dim == cfg.n_mels and pcen_decay(cfg) == math.exp(-40 / 16000 / 0.4)
    assert pcen_decay(config(frontend="logmel")) == 0.0
    assert DLRConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="frontend applies to the audio encoder only"):
        DLRConfig.preset("tiny-lm", frontend="pcen")
    with pytest.raises(ValueError, match="front-end state"):
        DLRModel(cfg, seed=0).encoder.encode_frames(torch.zeros(2, 40))
    # with the feature normalisation too: both states, PCEN first
    both = config(feature_norm_s=0.1)
    assert {"pcen_sum", "feat_sum"} <= set(state_spec(both))
    model = DLRModel(both, seed=1).double().eval()
    rec = to_recurrent(model, dtype=torch.complex128)
    x = audio(1, 40 * 30, seed=5)
    with torch.no_grad():
        ref = model(x)
    assert float((streamed(rec, x, [100, 555]) - ref).abs().max()) < F64_TOL * float(
        ref.abs().max()
    )
    assert float((reference_forward(model, x) - ref).abs().max()) < F64_TOL * float(ref.abs().max())


def test_checkpoint_and_snapshot_round_trip(tmp_path):
    """Saved and loaded, the learnt per-band parameters come back; a session restored
    mid-frame continues bitwise; a snapshot whose PCEN state no stream reaches is refused."""
    model = DLRModel(config(frame_stride=160), seed=0)
    randomise(model.encoder.pcen, 4)
    save_checkpoint(model, tmp_path / "m")
    rec = load_recurrent(tmp_path / "m")
    assert torch.equal(rec.encoder.pcen.log_r.detach(), model.encoder.pcen.log_r.detach())
    eng = Engine(make_backend(rec, "torch"), "pcen", 8)
    a = mid_frame_round_trip(eng, "pcen_count")
    bad = (("pcen_count", 1e6), ("pcen_count", -1.0), ("pcen_sum", float("nan")))
    refuses_bad_values(eng, a, (*bad, ("pcen_sum", -1.0)))


def test_exported_graphs_and_auto_knows():
    """ONNX and Triton graphs carry PCEN's state (compared with torch in test_frontend_onnx.py
    and test_triton_export.py); PCEN with the feature normalisation has none yet: refused by
    name in both, and "auto" does not try ONNX for it."""
    rec = to_recurrent(DLRModel(config(), seed=0))
    assert graph_names(rec.config)["inputs"][-2:] == ["pcen_sum", "pcen_count"]
    assert "onnx" in default_candidates(rec)
    both = to_recurrent(DLRModel(config(feature_norm_s=0.1), seed=0))
    with pytest.raises(ValueError, match="PCEN front end together with feature normalisation"):
        export_onnx(both, Path("unused"))
    with pytest.raises(ValueError, match="PCEN front end together with feature normalisation"):
        export_triton_onnx(both, Path("unused.onnx"))
    assert "onnx" not in default_candidates(both) and default_candidates(both)
    fast = make_backend(rec, "torch-fast")  # audio: the model's own code, as the torch backend
    x = audio(1, 40 * 20, dtype=torch.float32)
    assert torch.equal(fast.chunk(x, fast.init_state(1))[0], rec.chunk(x, rec.init_state(1))[0])


def test_offline_form_stays_out_of_half_precision_autocast():
    pcen = PCEN(6, 0.95)
    e = torch.rand(2, 40, 6) * 1e3 + 1e-3
    with torch.no_grad():
        want = pcen(e)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            got = pcen(e.bfloat16())
            again = pcen(e.bfloat16().float())
    assert got.dtype == torch.float32
    assert torch.allclose(got, again, atol=1e-6)
    assert float((got - want).abs().max()) < 0.05 * float(want.abs().max())
