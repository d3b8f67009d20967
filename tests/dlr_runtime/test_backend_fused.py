"""The fused decode step (numba) against its plain twin and against `RecurrentModel.step`.

Tolerances: float64 1e-10, float32 1e-5 (absolute, on logits of magnitude ~1-10 and states of
magnitude ~1-30). Batching is checked bit for bit: each row is computed alone in the kernel.
The first run compiles the kernel (~10-40 s on a busy 2-core machine), later runs load it
from numba's on-disk cache.
"""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, to_recurrent
from dlr_runtime.backends import fused_kernel as fk
from dlr_runtime.backends import make_backend
from dlr_runtime.engine import Engine

pytestmark = pytest.mark.skipif(not fk.AVAILABLE, reason="numba is not installed")
from dlr_runtime.backends.fused import FusedBackend, fused_supported  # noqa: E402

TOL = {torch.complex64: 1e-5, torch.complex128: 1e-10}
VARIANTS = {  # every branch of the kernel: B = 1 or not, norms, GLU, pre/post norm
    "dlr-layernorm-glu": {},
    "s4d-rmsnorm-postnorm": {"layer": "s4d", "norm": "rmsnorm", "prenorm": False},
    "lru-nonorm-noglu": {"layer": "lru", "norm": "none", "glu": False, "shared_lambda": False},
}


def _rec(cdtype: torch.dtype, **over) -> torch.nn.Module:
    model = DLRModel(DLRConfig.preset("tiny-lm", **over), seed=3)
    return to_recurrent(model.double() if cdtype == torch.complex128 else model, cdtype)


def _random_state(rec, batch: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    st = rec.init_state(batch)
    st["ssm"] = torch.randn(st["ssm"].shape, generator=gen, dtype=st["ssm"].dtype)
    return st


@pytest.mark.parametrize("cdtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_matches_ref_and_recurrent_step(cdtype, variant):
    rec = _rec(cdtype, **VARIANTS[variant])
    be = FusedBackend(rec)
    w = be.weights
    tok = torch.tensor([0, 5, 257])
    st = _random_state(rec, 3)
    planes = be.from_canonical(st)
    y, nr, ni = fk.fused_step(w, tok, planes["ssm_re"], planes["ssm_im"])
    y_ref, nr_ref, ni_ref = fk.fused_step_ref(w, tok, planes["ssm_re"], planes["ssm_im"])
    assert y.dtype == rec.rdtype and nr.shape == planes["ssm_re"].shape
    assert (y - y_ref).abs().max().item() < TOL[cdtype]
    assert max((nr - nr_ref).abs().max().item(), (ni - ni_ref).abs().max().item()) < TOL[cdtype]
    # several steps through the backend against RecurrentModel.step itself
    s_a, s_b = be.from_canonical(st), dict(st)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        t = torch.randint(0, 258, (3,), generator=gen)
        ya, s_a = be.step(t, s_a)
        yb, s_b = rec.step(t, s_b)
        assert (ya - yb).abs().max().item() < TOL[cdtype]
    canon = be.to_canonical(s_a)
    assert canon["ssm"].dtype == cdtype
    assert (canon["ssm"] - s_b["ssm"]).abs().max().item() < TOL[cdtype]


def test_batching_never_changes_a_session_output():
    rec = _rec(torch.complex64)
    be = FusedBackend(rec)
    st = be.from_canonical(_random_state(rec, 5, seed=2))
    tok = torch.tensor([1, 2, 3, 4, 5])
    y, new = be.step(tok, st)
    for r in range(5):
        y1, n1 = be.step(tok[r : r + 1], {k: v[r : r + 1] for k, v in st.items()})
        assert torch.equal(y1[0], y[r])
        assert all(torch.equal(n1[k][0], new[k][r]) for k in ("ssm_re", "ssm_im"))


def test_input_state_untouched_and_errors():
    rec = _rec(torch.complex64)
    be = FusedBackend(rec)
    st = be.from_canonical(_random_state(rec, 2))
    before = {k: v.clone() for k, v in st.items()}
    be.step(torch.tensor([1, 2]), st)
    assert all(torch.equal(st[k], before[k]) for k in st)
    with pytest.raises(ValueError, match="token ids"):
        be.step(torch.tensor([0, 258]), st)
    with pytest.raises(ValueError, match="matching"):
        be.step(torch.tensor([0]), st)
    assert be.state_bytes() == rec.state_bytes() == rec.state_bytes_per_session()
    assert set(be.init_state(2)) == {"ssm_re", "ssm_im"}
    canon = _random_state(rec, 2)
    assert torch.equal(be.to_canonical(be.from_canonical(canon))["ssm"], canon["ssm"])


def test_engine_on_fused_backend_equals_torch():
    rec = _rec(torch.complex64)
    fused = make_backend(rec, "fused")
    assert fused.name == "fused"
    a, b = Engine(rec, "lm", 4), Engine(fused, "lm", 4)
    sa, sb = [a.open(), a.open()], [b.open(), b.open()]
    prompts = [list(b"hi"), list(b"a longer prompt")]
    la, lb = a.prefill(sa, prompts), b.prefill(sb, prompts)
    assert torch.equal(la, lb)  # prefill is the torch chunk form in both
    toks = [10, 20]
    for _ in range(5):
        ya, yb = a.decode(sa, toks), b.decode(sb, toks)
        assert (ya - yb).abs().max().item() < 1e-5
        toks = [int(t) for t in ya.argmax(-1)]
    assert a.state_bytes_per_session() == b.state_bytes_per_session()
    blob = b.snapshot(sb[0])  # canonical layout: restores into the torch engine
    s_new = a.open()
    a.restore(s_new, blob)
    row = b.pool.row(sb[0])
    assert torch.equal(a.pool.row(s_new)["ssm"], torch.complex(row["ssm_re"], row["ssm_im"]))


def test_falls_back_to_torch_where_it_cannot_serve(monkeypatch):
    rec = _rec(torch.complex64)
    on_gpu = type("OnGpu", (), {"device": torch.device("cuda"), "config": rec.config})()
    assert "CPU-only" in (fused_supported(on_gpu) or "")
    monkeypatch.setattr(fk, "AVAILABLE", False)
    assert make_backend(rec, "fused") is rec
    with pytest.raises(RuntimeError, match="numba"):
        FusedBackend(rec)


def test_a_kernel_that_fails_to_build_falls_back_to_torch(monkeypatch, caplog):
    """Where numba cannot compile or cache (say, a read-only cache location), the server's
    default backend still serves: the torch step, with a warning naming the failure."""
    import dlr_runtime.backends.fused as fused

    rec = _rec(torch.complex64)

    def broken(*a, **k):
        raise RuntimeError("cannot cache function: no locator available")

    monkeypatch.setattr(fused, "FusedBackend", broken)
    with caplog.at_level("WARNING", logger="dlr_runtime.backends.fused"):
        assert make_backend(rec, "fused") is rec
    assert "no locator available" in caplog.text
