"""The ``logmel_pcen`` front end: each frame's log-mel features followed by its PCEN features.

- offline == chunk == step == the plain loop is in test_frontend.py (every head, window and
  feature normalisation, float64 1e-10, float32 1e-4) and, with PCEN's per-band parameters
  drawn at random, in test_pcen.py;
- its first half is exactly the ``logmel`` front end's features and its second the ``pcen``
  front end's, of the same energies;
- the state layout (PCEN's two tensors, no more), snapshots; its ONNX and Triton graphs are
  compared with torch in test_frontend_onnx.py and test_triton_export.py.
A ``logmel`` model widened to it (`training.widen_frontend`) is in
tests/training/test_widen_frontend.py.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dlr_runtime import DLRModel
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine
from dlr_runtime.export.onnx_export import graph_names
from dlr_runtime.frontend import LogMel
from dlr_runtime.model import frames_of
from dlr_runtime.recurrent import to_recurrent
from dlr_runtime.state_spec import state_spec
from tests.dlr_runtime.snapshot_checks import mid_frame_round_trip, refuses_bad_values
from tests.dlr_runtime.test_frontend import audio
from tests.dlr_runtime.test_pcen import config, randomise


def both(**over):
    return config(frontend="logmel_pcen", **over)


def test_halves_are_the_logmel_and_the_pcen_features():
    cfg = both()
    wide = DLRModel(cfg, seed=0).double().eval()
    pcen_only = DLRModel(replace(cfg, frontend="pcen"), seed=0).double().eval()
    randomise(wide.encoder.pcen, 1)
    pcen_only.encoder.pcen.load_state_dict(wide.encoder.pcen.state_dict())
    lm = LogMel(cfg.window, cfg.frame_stride, cfg.sample_rate, cfg.n_mels).double()
    frames = frames_of(audio(2, 40 * 30, seed=2), cfg.frame_stride, cfg.history)  # (B, T, W)
    with torch.no_grad():
        e = wide.encoder.frontend(frames)  # mel energies (B, T, M)
        feats = wide.encoder.pcen(e)  # (B, T, 2M)
        assert feats.shape == (2, 30, 2 * cfg.n_mels) == (2, 30, cfg.feature_dim)
        assert torch.equal(feats[..., : cfg.n_mels], lm(frames))
        assert torch.equal(feats[..., cfg.n_mels :], pcen_only.encoder.pcen(e))
    assert wide.encoder.frame.in_features == 2 * cfg.n_mels


def test_state_snapshots_and_exported_graphs():
    cfg = both(frame_stride=160)
    assert set(state_spec(cfg, torch.complex64)) == set(
        state_spec(replace(cfg, frontend="pcen"), torch.complex64)
    )  # the log-mel half has no state of its own
    rec = to_recurrent(DLRModel(cfg, seed=0))
    assert graph_names(cfg)["inputs"][-2:] == ["pcen_sum", "pcen_count"]
    eng = Engine(make_backend(rec, "torch"), "both", 8)
    a = mid_frame_round_trip(eng, "pcen_count")
    refuses_bad_values(eng, a, (("pcen_count", -1.0), ("pcen_sum", -1.0)))
