"""Optimiser groups, schedule and the pickle-free training state."""

from __future__ import annotations

import math

import torch

from dlr_runtime import DLRConfig, DLRModel
from training.config import TrainConfig
from training.optim import lr_factor, make_optimizer, param_groups
from training.state import Progress, load_train_state, save_train_state


def _model() -> DLRModel:
    return DLRModel(DLRConfig(d_model=8, d_state=4, n_layers=2), seed=0)


def test_ssm_parameters_get_their_own_lr_and_no_decay() -> None:
    model = _model()
    cfg = TrainConfig(lr=1e-2, ssm_lr=1e-4, weight_decay=0.3)
    groups = {g["name"]: g for g in param_groups(model, cfg)}
    ssm_ids = {id(p) for blk in model.blocks for p in blk.ssm.parameters()}
    assert {id(p) for p in groups["ssm"]["params"]} == ssm_ids
    assert groups["ssm"]["lr"] == 1e-4 and groups["ssm"]["weight_decay"] == 0.0
    assert groups["decay"]["weight_decay"] == 0.3 and groups["decay"]["lr"] == 1e-2
    assert all(p.dim() >= 2 for p in groups["decay"]["params"])
    assert not any(
        id(p) in ssm_ids for p in groups["decay"]["params"] + groups["no_decay"]["params"]
    )
    n_all = sum(1 for _ in model.parameters())
    assert sum(len(g["params"]) for g in groups.values()) == n_all


def test_warmup_then_cosine() -> None:
    total, warm, floor = 100, 10, 0.1
    assert lr_factor(0, total, warm, floor) == 0.1
    assert lr_factor(9, total, warm, floor) == 1.0
    assert lr_factor(10, total, warm, floor) == 1.0
    mid = lr_factor(55, total, warm, floor)
    assert math.isclose(mid, floor + (1 - floor) * 0.5, rel_tol=1e-9)
    assert math.isclose(lr_factor(100, total, warm, floor), floor)
    values = [lr_factor(s, total, warm, floor) for s in range(warm, total)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_train_state_round_trip(tmp_path) -> None:
    torch.manual_seed(0)
    model = _model()
    opt = make_optimizer(model, TrainConfig())
    for _ in range(3):
        loss = model(torch.randint(0, 258, (2, 6))).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    progress = Progress(step=3, epoch=1, step_in_epoch=1, best=0.5, best_step=2, items=12)
    save_train_state(tmp_path, opt, progress, {"recipe": "x"})
    expected_rng = torch.rand(4)

    fresh = make_optimizer(model, TrainConfig())
    got, run = load_train_state(tmp_path, fresh, torch.device("cpu"))
    assert got == progress and run == {"recipe": "x"}
    assert torch.equal(torch.rand(4), expected_rng)  # RNG restored to the saved point
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for idx, st in a["state"].items():
        for key, value in st.items():
            torch.testing.assert_close(b["state"][idx][key], value, rtol=0, atol=0)
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob("*.pkl"))
