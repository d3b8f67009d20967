"""FastTorchBackend (compiled / CUDA-graph decode step) against RecurrentModel.

Tolerances: float32 real twin vs complex64 step 1e-5; float64 twin vs complex128 step 1e-10.
The compile test builds one tiny graph (a few seconds to a minute on a busy CPU); CUDA tests
run only where a GPU is present.
"""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends.torch_compiled import FastTorchBackend

CFG = DLRConfig.preset("tiny-lm", vocab_size=30)
TOL = {torch.complex64: 1e-5, torch.complex128: 1e-10}


def _decode(model, steps: int, batch: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    state, ys = model.init_state(batch), []
    for _ in range(steps):
        y, state = model.step(torch.randint(0, 30, (batch,), generator=gen).to(model.device), state)
        ys.append(y)
    return torch.stack(ys, 1), state


@pytest.mark.parametrize("cdtype", [torch.complex64, torch.complex128])
def test_eager_fast_step_matches(cdtype):
    rec = to_recurrent(DLRModel(CFG, seed=0), cdtype)
    be = FastTorchBackend(rec, compile_cpu=False)
    y_ref, s_ref = _decode(rec, 7, 3)
    y, s = _decode(be, 7, 3)
    assert s["ssm"].dtype == cdtype
    assert (y - y_ref).abs().max().item() < TOL[cdtype]
    assert (s["ssm"] - s_ref["ssm"]).abs().max().item() < TOL[cdtype]


def test_delegates_and_interface(models_dir):
    rec = to_recurrent(DLRModel(CFG, seed=0))
    be = FastTorchBackend(rec, compile_cpu=False)
    assert be.name == "torch-fast" and be.config == rec.config and be.device == rec.device
    assert be.state_bytes_per_session() == rec.state_bytes_per_session()
    x = torch.randint(0, 30, (2, 5))
    y, s = be.chunk(x, be.init_state(2))
    y_ref, _ = rec.chunk(x, rec.init_state(2))
    assert torch.equal(y, y_ref)
    y2, _ = be.step(x[:, 0], s)  # a chunk state continues in the fast step
    assert y2.shape == (2, 30)
    with pytest.raises(ValueError, match="token ids"):
        be.step(torch.tensor([0, 30]), s)
    with pytest.raises(ValueError, match="matching"):
        be.step(torch.tensor([0]), s)
    with pytest.raises(RuntimeError, match="CUDA"):
        be.capture([1])


def test_audio_model_uses_reference_step():
    cfg = DLRConfig.preset("micro-speech", frame_stride=4)
    rec = to_recurrent(DLRModel(cfg, seed=0))
    be = FastTorchBackend(rec)
    x = torch.randn(2, 9)
    s_ref, s = rec.init_state(2), be.init_state(2)
    for t in range(9):
        y_ref, s_ref = rec.step(x[:, t], s_ref)
        y, s = be.step(x[:, t], s)
        assert torch.equal(y, y_ref)
    assert torch.equal(be.scores(s), rec.scores(s_ref))


@pytest.mark.slow
def test_cpu_compiled_step_matches_eager():
    rec = to_recurrent(DLRModel(CFG, seed=0))
    be = FastTorchBackend(rec)
    chose = be.calibrate(2, reps=3)
    assert isinstance(chose, bool)
    assert be._compiled is not None and not be._compile_broken
    tok = torch.tensor([3, 7])
    ssm = torch.view_as_real(torch.randn(2, 2, 16, 8, dtype=torch.complex64))
    with torch.no_grad():
        y_c, n_c = be._compiled(tok, ssm)
        y_e, n_e = be.stepper(tok, ssm)
    assert (y_c - y_e).abs().max().item() < 1e-5
    assert (n_c - n_e).abs().max().item() < 1e-5
    y_ref, _ = _decode(rec, 4, 2)
    y, _ = _decode(be, 4, 2)  # whichever path calibration picked
    assert (y - y_ref).abs().max().item() < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batch", [1, 5])
def test_cuda_graph_step_matches(batch):
    rec = to_recurrent(DLRModel(CFG, seed=0)).to("cuda")
    be = FastTorchBackend(rec)
    be.capture([batch])
    y_ref, s_ref = _decode(rec, 6, batch)
    y, s = _decode(be, 6, batch)
    assert be.describe()["cuda_graph_batches"] == [batch]
    assert (y - y_ref).abs().max().item() < 1e-4
    assert (s["ssm"] - s_ref["ssm"]).abs().max().item() < 1e-4
