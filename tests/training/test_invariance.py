"""The domain-invariance penalty (training/invariance.py): against a plain loop, its bounds,
that it hides a domain from a linear encoder and keeps the task, and its place in the recipe."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from training.invariance import IGNORE, InvarianceConfig, domain_share


def _plain_share(feats: torch.Tensor, domains: torch.Tensor, groups: torch.Tensor | None):
    """The same ratio with Python loops over frames, groups and domains."""
    rows = [
        (feats[b, t], int(domains[b, t]), 0 if groups is None else int(groups[b, t]))
        for b in range(feats.shape[0])
        for t in range(feats.shape[1])
        if int(domains[b, t]) != IGNORE
    ]
    z = torch.stack([r[0] for r in rows])
    total = sum(float(((x - z.mean(0)) ** 2).sum()) for x in z) / len(z)
    betweens = []
    for g in sorted({r[2] for r in rows}):
        members = [r for r in rows if r[2] == g]
        doms = sorted({r[1] for r in members})
        if len(doms) < 2:
            continue
        mu_g = torch.stack([r[0] for r in members]).mean(0)
        spread = 0.0
        for k in doms:
            zk = torch.stack([r[0] for r in members if r[1] == k])
            spread += len(zk) * float(((zk.mean(0) - mu_g) ** 2).sum())
        betweens.append(spread / len(members))
    return sum(betweens) / len(betweens) / total if betweens else 0.0


@pytest.mark.parametrize("classwise", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_share_matches_a_plain_loop_in_float64(seed: int, classwise: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(3, 30, 5, dtype=torch.float64, generator=gen)
    domains = torch.randint(0, 4, (3, 30), generator=gen)
    domains[torch.rand(3, 30, generator=gen) < 0.3] = IGNORE
    feats = feats + 0.7 * domains.clamp_min(0).unsqueeze(-1).double()  # some domain signal
    groups = torch.randint(0, 3, (3, 30), generator=gen) if classwise else None
    got = domain_share(feats, domains, groups)
    assert got.dtype == torch.float64
    assert abs(float(got) - _plain_share(feats, domains, groups)) < 1e-12


def test_the_share_is_zero_for_equal_means_one_for_pure_domain_and_ignores_scale() -> None:
    domains = torch.tensor([[0, 0, 1, 1, IGNORE]])
    same = torch.tensor([[[1.0], [-1.0], [1.0], [-1.0], [50.0]]], dtype=torch.float64)
    assert float(domain_share(same, domains)) == pytest.approx(0.0, abs=1e-15)
    pure = torch.tensor([[[0.0], [0.0], [3.0], [3.0], [9.0]]], dtype=torch.float64)
    assert float(domain_share(pure, domains)) == pytest.approx(1.0, abs=1e-15)
    mixed = torch.randn(1, 5, 3, dtype=torch.float64)
    assert float(domain_share(10 * mixed, domains)) == pytest.approx(
        float(domain_share(mixed, domains)), abs=1e-12
    )  # shrinking the features cannot lower it


def test_one_domain_or_no_word_costs_nothing_and_still_backpropagates() -> None:
    feats = torch.randn(2, 6, 4, requires_grad=True)
    for domains in (torch.full((2, 6), IGNORE), torch.zeros(2, 6, dtype=torch.long)):
        share = domain_share(feats, domains)
        assert float(share.detach()) == 0.0
        share.backward()
        assert feats.grad is not None and float(feats.grad.abs().sum()) == 0.0
    # classwise: a group heard from one domain only adds nothing
    domains = torch.tensor([[0, 1, 0, 0, 1, 1]])
    groups = torch.tensor([[0, 0, 1, 1, 2, 2]])  # only group 0 has both domains
    x = torch.randn(1, 6, 2, dtype=torch.float64)
    keep = torch.tensor([[True, True, False, False, False, False]])
    only = torch.where(keep, domains, torch.full_like(domains, IGNORE))
    between_0 = float(domain_share(x, only)) * float(
        ((x[keep] - x[keep].mean(0)) ** 2).sum(-1).mean()
    )
    total = float(((x[0] - x[0].mean(0)) ** 2).sum(-1).mean())
    assert float(domain_share(x, domains, groups)) == pytest.approx(between_0 / total, abs=1e-12)


def _probe_accuracy(z: torch.Tensor, y: torch.Tensor, steps: int = 300) -> float:
    """A fresh logistic regression trained on fixed features z (N, H) to predict y (N,)."""
    torch.manual_seed(0)
    probe = nn.Linear(z.shape[1], 2)
    opt = torch.optim.Adam(probe.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(probe(z), y).backward()
        opt.step()
    return float((probe(z).argmax(-1) == y).float().mean())


def _train_encoder(weight: float) -> tuple[float, float]:
    """A linear encoder of inputs that carry a label and a domain, trained on the label with
    the penalty at `weight`; returns (task accuracy, a fresh probe's domain accuracy)."""
    gen = torch.Generator().manual_seed(0)
    n = 512
    label = torch.randint(0, 2, (n,), generator=gen)
    domain = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, 4, generator=gen) * 0.3
    x[:, 0] += 2.0 * label - 1.0
    x[:, 1] += 2.0 * domain - 1.0
    x[:, 2] += 0.5 * (2.0 * domain - 1.0)
    torch.manual_seed(1)
    enc, head = nn.Linear(4, 4), nn.Linear(4, 2)
    opt = torch.optim.Adam([*enc.parameters(), *head.parameters()], lr=0.02)
    for _ in range(600):
        z = enc(x)
        share = domain_share(z.unsqueeze(0), domain.unsqueeze(0))
        loss = F.cross_entropy(head(z), label) + weight * share
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        z = enc(x)
        task = float((head(z).argmax(-1) == label).float().mean())
    return task, _probe_accuracy(z, domain)


@pytest.mark.slow  # 4 s: trains two small probes
def test_the_penalty_hides_the_domain_and_keeps_the_task() -> None:
    task_off, probe_off = _train_encoder(0.0)
    task_on, probe_on = _train_encoder(1.0)
    assert task_off > 0.95 and task_on > 0.95
    assert probe_off > 0.95  # the domain is plainly in the features without the penalty
    assert probe_on < 0.65  # and close to chance (0.5) with it


@pytest.mark.parametrize(
    ("cfg", "msg"),
    [
        (InvarianceConfig(weight=-0.1), "--invariance-weight must be >= 0"),
        (InvarianceConfig(weight=float("nan")), "--invariance-weight must be >= 0"),
    ],
)
def test_bad_settings_are_refused(cfg: InvarianceConfig, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        cfg.check()


def _recipe(**kw):
    from training.config import TrainConfig
    from training.modelopts import ModelOptions
    from training.recipes.kws import KWSOptions, KWSRecipe

    small = ModelOptions(d_model=8, d_state=4, n_layers=1)
    return KWSRecipe(KWSOptions(**{"vtlp": False, **kw}), small, TrainConfig())


def test_the_recipe_refuses_bad_options() -> None:
    with pytest.raises(ValueError, match="--invariance-weight must be >= 0"):
        _recipe(invariance_weight=-1.0)


@pytest.mark.parametrize("classwise", [False, True])
def test_the_recipe_adds_the_weighted_share_to_the_frame_loss(classwise: bool) -> None:
    from torch.utils.data import default_collate

    from training.data.sc12 import KWSWindows, WindowConfig

    from .test_kws_data import _pool

    plain = _recipe()
    penalised = _recipe(invariance_weight=0.5, invariance_classwise=classwise)
    windows = KWSWindows(_pool(), [], WindowConfig(), seed=1, length=24)
    penalised.train_set = windows  # (setup's; only its domain names are read)
    batch = default_collate([windows[i] for i in range(24)])
    model = plain.build_model()
    keys = set(model.state_dict())
    base, n = plain.loss(model, batch, torch.device("cpu"))
    both, _ = penalised.loss(model, batch, torch.device("cpu"))
    with torch.no_grad():
        h = model.head.scored_features(model.hidden(batch.audio))  # (B, F, H)
        f = min(h.shape[1], batch.targets.shape[1])
        groups = batch.words[:, :f] if classwise else None
        want = domain_share(h[:, :f], batch.domains[:, :f], groups)
    assert n == 24 and float(want) > 0
    assert abs(float((both - base).detach()) - 0.5 * float(want)) < 1e-6
    assert set(model.state_dict()) == keys  # nothing added to the model
    assert penalised.training_metrics()["domain_share"] == pytest.approx(float(want), abs=1e-6)
    assert plain.training_metrics() == {}  # no VTLP: the plain forward, nothing measured
    measured = _recipe(vtlp=True, invariance_classwise=classwise)
    measured.build_model()  # (its VTLP front end)
    measured.loss(model, batch, torch.device("cpu"))
    assert 0.0 < measured.training_metrics()["domain_share"] < 1.0  # measured, not added
