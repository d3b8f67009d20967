"""The classifier head whose last label is the union of several classes (unknown_head.py).

- offline (FFT convolution) == chunk == step == the plain loop of `reference_forward`, which
  sums the classes' exponentials itself: float64 / complex128 to 1e-10 of the output scale,
  float32 / complex64 to 1e-4 (as test_frontend.py); ONNX Runtime in test_frontend_onnx.py;
- softmax of the scores is the per-class softmax with the union's classes summed;
- `split_last_row` keeps a plain model's scores, so a fine-tune starts where the model was;
- the config's round trip (old checkpoints' configs unchanged) and refusals, and a checkpoint
  that keeps the union's rows.
"""

from __future__ import annotations

from dataclasses import replace

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
from dlr_runtime.unknown_head import UnionLinear, group, split_last_row
from tests.dlr_runtime.test_frontend import F64_TOL, audio, check_float32, config, streamed

UNION = 7


def union_config(frontend: str = "logmel", window: float = 0.01, **over) -> DLRConfig:
    return replace(config(frontend, window, **over), unknown_classes=UNION)


@pytest.mark.parametrize("frontend", ["raw", "logmel"])
@pytest.mark.parametrize("window", [0.0, 0.01])
def test_offline_chunk_step_agree_float64(frontend, window):
    model = DLRModel(union_config(frontend, window), seed=0).double().eval()
    assert isinstance(model.head.proj, UnionLinear)
    assert model.head.proj.weight.shape == (3 + UNION, 8)
    rec = to_recurrent(model, dtype=torch.complex128, max_block=16)
    x = audio(2, 40 * 70)
    with torch.no_grad():
        ref = model(x)  # (2, 70, 4)
    assert ref.shape == (2, 70, 4)
    scale = ref.abs().max()
    assert float((reference_forward(model, x) - ref).abs().max() / scale) < F64_TOL
    for cuts, steps_from in (([], None), ([7, 333, 334, 1201], None), ([13, 900], 2400)):
        out = streamed(rec, x, cuts, steps_from)
        assert float((out - ref).abs().max() / scale) < F64_TOL
    _, state = rec.chunk(x, rec.init_state(2))
    assert torch.allclose(rec.scores(state), ref[:, -1], atol=F64_TOL * float(scale))


def test_offline_chunk_step_agree_float32():
    check_float32(replace(config("logmel", 0.02, stride=320), unknown_classes=UNION))


def test_softmax_of_the_scores_sums_the_union():
    g = torch.Generator().manual_seed(0)
    fine = 4 * torch.randn(5, 3, 3 + UNION, generator=g, dtype=torch.float64)
    p_fine = fine.softmax(-1)
    p = group(fine, 4).softmax(-1)
    assert torch.allclose(p[..., :3], p_fine[..., :3], atol=1e-14)
    assert torch.allclose(p[..., 3], p_fine[..., 3:].sum(-1), atol=1e-14)


def test_the_max_rule_scores_the_most_likely_class():
    fine = torch.tensor([[0.5, -1.0, 2.0, 1.0, 2.0]], dtype=torch.float64)  # 2 labels + 3 classes
    assert torch.equal(group(fine, 3, "max"), torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64))
    total = torch.log(2 * torch.exp(torch.tensor(2.0)) + torch.exp(torch.tensor(1.0)))
    assert torch.allclose(group(fine, 3)[0, 2], total.double())
    with pytest.raises(ValueError, match="rule"):
        UnionLinear(4, 3, 2, rule="mean")


def test_split_last_row_keeps_the_scores():
    plain = DLRModel(config("logmel", 0.01), seed=4).double().eval()
    proj = plain.head.proj
    union = split_last_row(proj, UNION)
    f = torch.randn(6, 8, dtype=torch.float64)
    assert torch.allclose(union(f), proj(f), atol=1e-12)
    split = DLRModel(union_config(), seed=9).double().eval()
    state = plain.state_dict()
    state["head.proj.weight"], state["head.proj.bias"] = union.weight, union.bias
    split.load_state_dict(state)
    x = audio(1, 40 * 30)
    with torch.no_grad():
        assert torch.allclose(split(x), plain(x), atol=1e-10)
    one = split_last_row(proj, 1)  # one class: the plain projection
    assert torch.allclose(one(f), proj(f), atol=1e-14)


def test_config_round_trip_refusals_and_checkpoint(tmp_path):
    cfg = union_config()
    assert DLRConfig.from_dict(cfg.to_dict()) == cfg
    assert "unknown_classes" not in config("logmel", 0.01).to_dict()  # old hashes unchanged
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="unknown_classes"):
            replace(union_config(), unknown_classes=bad)
    with pytest.raises(ValueError, match="classifier"):
        DLRConfig.preset("tiny-lm", unknown_classes=3)
    model = DLRModel(cfg, seed=2).eval()
    save_checkpoint(model, tmp_path / "m")
    rec = load_recurrent(tmp_path / "m", dtype=torch.complex128)
    assert rec.config.unknown_classes == UNION and rec.config.labels == cfg.labels
    x = audio(1, 40 * 20)
    y, _ = rec.chunk(x, rec.init_state(1))
    with torch.no_grad():
        want = model.double()(x)
    assert torch.allclose(y, want, atol=1e-6)
