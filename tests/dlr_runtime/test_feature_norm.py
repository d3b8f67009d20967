"""Causal feature normalisation (`dlr_runtime.feature_norm`) in every form of the runtime.

- offline == chunk == step == the plain loop: in test_frontend.py, every front end and head
  with and without the normalisation (float64 1e-10, float32 1e-4);
- `normalise_chunk` against a loop of `normalise_step`;
- what it is for: a constant added to every log-mel band (a gain change of the microphone) is
  removed exactly from the first frame on, so the model's scores do not depend on the gain;
- the state layout, snapshots (mid-frame round trip, impossible values refused), the config's
  round trip and refusals, and the refusal of the stateless per-frame encoder.
ONNX Runtime and Triton graphs are checked in test_frontend_onnx.py / test_triton_export.py.
"""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, load_recurrent, save_checkpoint
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from dlr_runtime.feature_norm import normalise, normalise_chunk, normalise_step
from dlr_runtime.state_spec import state_bytes, state_spec
from tests.dlr_runtime.snapshot_checks import mid_frame_round_trip, refuses_bad_values
from tests.dlr_runtime.test_frontend import LABELS, audio


def config(frontend: str = "logmel", pool: float = 0.01, frame_window: int = 0, **over):
    base = dict(
        d_model=8, d_state=6, n_layers=2, encoder="audio", decoder="classifier", labels=LABELS,
        frame_stride=40, frontend=frontend, n_mels=10, pool_window_s=pool, dt_min=0.01,
        dt_max=0.5, sample_rate=16000, frame_window=frame_window, feature_norm_s=0.02,
    )  # fmt: skip
    return DLRConfig(**{**base, **over})


def test_chunk_equals_a_loop_of_steps():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(3, 300, 5, generator=g, dtype=torch.float64)  # longer than a pool block
    s0 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    c0 = torch.tensor([0.0, 1.0, 7.5], dtype=torch.float64)
    got, s_end, c_end = normalise_chunk(f, s0, c0, 0.97)
    s, c, want = s0, c0, []
    for t in range(f.shape[1]):
        g_t, s, c = normalise_step(f[:, t], s, c, 0.97)
        want.append(g_t)
    assert torch.allclose(got, torch.stack(want, 1), atol=1e-12)
    assert torch.allclose(s_end, s, atol=1e-10) and torch.allclose(c_end, c, atol=1e-12)
    # from an empty state the first frame is exactly zero, as in every training window
    assert float(normalise(f, 0.97)[:, 0].abs().max()) == 0.0


def test_a_constant_channel_offset_is_removed_from_the_first_frame():
    """log-mel of k x audio = log-mel of audio + log(k^2) / 4 in every band (while the
    energies are far above the log floor): with normalisation the scores do not move."""
    model = DLRModel(config(pool=0.05, feature_norm_s=0.5), seed=2).double().eval()
    plain = DLRModel(config(pool=0.05, feature_norm_s=0.0), seed=2).double().eval()
    plain.load_state_dict(model.state_dict())
    x = audio(1, 40 * 60, seed=3)
    with torch.no_grad():
        for gain in (0.1, 4.0):
            assert float((model(gain * x) - model(x)).abs().max()) < 1e-3
            assert float((plain(gain * x) - plain(x)).abs().max()) > 1e-2  # the gain did matter
        f = torch.randn(2, 30, 4, dtype=torch.float64)
        assert torch.allclose(normalise(f + 3.0, 0.9), normalise(f, 0.9), atol=1e-12)


def test_state_layout_and_size():
    cfg = config()
    spec = state_spec(cfg, torch.complex64)
    assert spec["feat_sum"] == ((cfg.n_mels,), torch.float64)
    assert spec["feat_count"] == ((), torch.float64)
    assert state_bytes(spec) - state_bytes(state_spec(config(feature_norm_s=0.0))) == 8 * 11
    raw = state_spec(config("raw", frame_window=80), torch.complex64)
    assert raw["feat_sum"][0] == (80,)  # a raw front end's features are the window's samples


def test_config_round_trip_and_refusals():
    cfg = config()
    assert DLRConfig.from_dict(cfg.to_dict()) == cfg
    assert "feature_norm_s" not in config(feature_norm_s=0.0).to_dict()  # old hashes unchanged
    with pytest.raises(ValueError, match="feature_norm_s must be >= 0"):
        config(feature_norm_s=-1.0)
    with pytest.raises(ValueError, match="audio encoder only"):
        DLRConfig.preset("tiny-lm", feature_norm_s=1.0)
    model = DLRModel(cfg, seed=0)
    with pytest.raises(ValueError, match="no front-end state"):
        model.encoder.encode_frames(torch.zeros(2, 40))


def test_checkpoint_and_snapshot_round_trip(tmp_path):
    """Saved and loaded, the model keeps its normalisation; a session restored mid-frame
    continues bitwise; a snapshot whose feature state no stream can reach is refused."""
    save_checkpoint(DLRModel(config(frame_stride=160, feature_norm_s=0.3), seed=0), tmp_path / "m")
    rec = load_recurrent(tmp_path / "m")
    assert rec.config.feature_norm_s == 0.3
    eng = Engine(make_backend(rec, "torch"), "norm", 8)
    a = mid_frame_round_trip(eng, "feat_count")
    refuses_bad_values(
        eng, a, (("feat_count", 1e6), ("feat_count", -1.0), ("feat_sum", float("nan")))
    )
