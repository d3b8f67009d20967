"""Convolution == chunk == step == reference loop, for random configurations.

Tolerances (relative to max |reference output|):
- float64 / complex128: 1e-10. Every form is exact math; observed errors are ~1e-13.
- float32 / complex64, FFT and chunk forms: 2e-5. FFT round-off grows like eps * log2(n) with
  eps = 6e-8; observed ~5e-7 at L = 2K, so 2e-5 leaves headroom without hiding a real bug
  (a wrong term changes outputs by O(1)).
- float32 / complex64, step form: 2e-5 + 6e-8 * L. lambda itself is rounded to complex64 with
  relative error up to 2^-24 ~ 6e-8, so after t steps lambda^t is off by ~t * 6e-8 (dlr.md
  pitfall 2); observed 2.6e-5 at L = 2048, against a bound of 1.4e-4.
"""

from __future__ import annotations

import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, reference_forward, to_recurrent

F64_TOL = 1e-10


def f32_tol(length: int, step: bool) -> float:
    return 2e-5 + (6e-8 * length if step else 0.0)


def make(encoder: str, **kw) -> DLRConfig:
    base = dict(d_model=8, d_state=6, n_layers=2)
    base.update(kw)
    if encoder == "tokens":
        return DLRConfig(encoder="tokens", decoder="lm", vocab_size=40, **base)
    return DLRConfig(
        encoder="audio", decoder="classifier", labels=["a", "b", "c"], frame_stride=4, **base
    )


def inputs(cfg: DLRConfig, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if cfg.encoder == "tokens":
        return torch.randint(0, cfg.vocab_size, (batch, length), generator=g)
    return torch.randn(batch, length, generator=g, dtype=torch.float64)


def run_steps(rec, x: torch.Tensor) -> torch.Tensor:
    """Outputs of the step form at every position that the conv form also reports."""
    stride = rec.config.frame_stride
    state, outs = rec.init_state(x.shape[0]), []
    for t in range(x.shape[1]):
        y, state = rec.step(x[:, t], state)
        if (t + 1) % stride == 0:
            outs.append(y)
    return torch.stack(outs, dim=1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


CASES = [
    (enc, layer, shared, init)
    for enc in ("tokens", "audio")
    for layer in ("dlr", "s4d", "lru")
    for shared in (True, False)
    for init in ("omega", "random")
]


@pytest.mark.parametrize("encoder,layer,shared,init", CASES)
def test_all_forms_agree_float64(encoder: str, layer: str, shared: bool, init: str) -> None:
    cfg = make(encoder, layer=layer, shared_lambda=shared, init=init, norm="rmsnorm", glu=shared)
    model = DLRModel(cfg, seed=3).double().eval()
    x = inputs(cfg, batch=2, length=160)
    ref = reference_forward(model, x)
    with torch.no_grad():
        conv = model(x)
    rec = to_recurrent(
        model, dtype=torch.complex128, max_block=40
    )  # several blocks, both conv paths
    chunk, _ = rec.chunk(x, rec.init_state(2))
    step = run_steps(rec, x)
    assert conv.shape == ref.shape == chunk.shape == step.shape
    assert rel(conv, ref) < F64_TOL
    assert rel(chunk, ref) < F64_TOL
    assert rel(step, ref) < F64_TOL


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("encoder", ["tokens", "audio"])
def test_decay_floor_bounds_every_mode_and_all_forms_agree(encoder: str, shared: bool) -> None:
    """`min_decay` caps every mode's time constant and stays exact in every form (float64)."""
    floor = 0.05
    cfg = make(encoder, shared_lambda=shared, dt_min=1e-6, dt_max=1e-5, min_decay=floor)
    model = DLRModel(cfg, seed=2).double().eval()
    plain = DLRModel(make(encoder, shared_lambda=shared, dt_min=1e-6, dt_max=1e-5), seed=2)
    for block, ref_block in zip(model.blocks, plain.blocks, strict=True):
        re = block.ssm.recurrent_params().log_lam.real.detach()
        assert float(re.max()) <= -floor  # no mode slower than 1 / floor steps
        same_p = block.ssm.p.detach().double() ** 2  # the same parameters, floor added
        assert torch.allclose(ref_block.ssm.recurrent_params().log_lam.real, -same_p, atol=1e-12)
        assert torch.allclose(re, -(same_p + floor), atol=1e-12)
    x = inputs(cfg, batch=2, length=160)
    ref = reference_forward(model, x)
    with torch.no_grad():
        conv = model(x)
    rec = to_recurrent(model, dtype=torch.complex128, max_block=40)
    assert float(rec.log_lam.real.max()) <= -floor
    chunk, _ = rec.chunk(x, rec.init_state(2))
    step = run_steps(rec, x)
    assert rel(conv, ref) < F64_TOL
    assert rel(chunk, ref) < F64_TOL
    assert rel(step, ref) < F64_TOL


@pytest.mark.parametrize("encoder", ["tokens", "audio"])
def test_all_forms_agree_float32(encoder: str) -> None:
    cfg = make(encoder, d_model=16, d_state=32, dt_min=1e-3)
    model = DLRModel(cfg, seed=1).eval()
    length = 2048
    x = inputs(cfg, batch=2, length=length)
    ref = reference_forward(model, x)  # float64 copy of the float32 weights
    with torch.no_grad():
        conv = model(x.float() if encoder == "audio" else x)
    rec = to_recurrent(model, dtype=torch.complex64)
    chunk, _ = rec.chunk(x, rec.init_state(2))
    step = run_steps(rec, x[:, :512])  # the Python step loop is slow; 512 steps suffice
    assert rel(conv, ref) < f32_tol(length, step=False)
    assert rel(chunk, ref) < f32_tol(length, step=False)
    assert rel(step, ref[:, : step.shape[1]]) < f32_tol(512, step=True)


@pytest.fixture(scope="module")
def long_case() -> tuple[DLRModel, torch.Tensor, torch.Tensor]:
    """L = 16384 with slowly decaying modes (dt <= 1e-3): the kernel spans the whole sequence."""
    cfg = DLRConfig(d_model=4, d_state=8, n_layers=1, vocab_size=16, dt_min=1e-4, dt_max=1e-3)
    model = DLRModel(cfg, seed=0).eval()
    x = inputs(cfg, batch=1, length=16384)
    return model, x, reference_forward(model, x)


@pytest.mark.slow
def test_long_sequence_16k_float64(long_case) -> None:
    model, x, ref = long_case
    m64 = model.double()
    with torch.no_grad():
        conv = m64(x)
    rec = to_recurrent(m64, dtype=torch.complex128, max_block=1024)
    chunk, _ = rec.chunk(x, rec.init_state(1))
    model.float()
    assert rel(conv, ref) < F64_TOL
    assert rel(chunk, ref) < F64_TOL


def test_long_sequence_16k_float32_chunk_does_not_drift(long_case) -> None:
    """complex64 state, but powers of lambda formed in complex128: no t * eps drift in chunk form."""
    model, x, ref = long_case
    rec = to_recurrent(model.float(), dtype=torch.complex64, max_block=512)
    chunk, _ = rec.chunk(x, rec.init_state(1))
    assert rel(chunk, ref) < f32_tol(16384, step=False)


@pytest.mark.parametrize("encoder", ["tokens", "audio"])
def test_causality(encoder: str) -> None:
    cfg = make(encoder)
    model = DLRModel(cfg, seed=0).double().eval()
    x = inputs(cfg, batch=1, length=256)
    cut = 128
    x2 = x.clone()
    x2[:, cut:] = inputs(cfg, batch=1, length=256 - cut, seed=9)
    with torch.no_grad():
        y1, y2 = model(x), model(x2)
    kept = cut // cfg.frame_stride
    # FFT round-off lets later inputs touch earlier outputs at ~1e-16, never more
    torch.testing.assert_close(y1[:, :kept], y2[:, :kept], rtol=0, atol=1e-12)
    assert not torch.allclose(y1[:, kept:], y2[:, kept:])  # later outputs do see the change


def test_batched_equals_alone() -> None:
    for encoder in ("tokens", "audio"):
        cfg = make(encoder)
        rec = to_recurrent(DLRModel(cfg, seed=2).double().eval(), dtype=torch.complex128)
        x = inputs(cfg, batch=5, length=200)
        y_all, st_all = rec.chunk(x, rec.init_state(5))
        for b in range(5):
            y_one, st_one = rec.chunk(x[b : b + 1], rec.init_state(1))
            torch.testing.assert_close(y_all[b : b + 1], y_one, rtol=0, atol=1e-12)
            for k in st_all:
                torch.testing.assert_close(st_all[k][b : b + 1], st_one[k], rtol=0, atol=1e-12)


def test_streaming_classifier_matches_offline() -> None:
    """A classifier fed in 100 ms chunks reports the offline scores at every completed frame."""
    cfg = DLRConfig(
        d_model=16, d_state=16, n_layers=2, encoder="audio", decoder="classifier",
        labels=["yes", "no", "up"], frame_stride=160, sample_rate=16000,
    )  # fmt: skip
    model = DLRModel(cfg, seed=5).eval()
    audio = torch.randn(3, 16000, generator=torch.Generator().manual_seed(1)) * 0.3
    with torch.no_grad():
        offline = model(audio)  # (3, 100, 3)
    rec = to_recurrent(model, dtype=torch.complex64)
    state, outs = rec.init_state(3), []
    for piece in audio.split(1600, dim=1):
        y, state = rec.chunk(piece, state)
        outs.append(y)
    streamed = torch.cat(outs, dim=1)
    assert rel(streamed, offline) < f32_tol(100, step=False)
    assert torch.equal(streamed[:, -1].argmax(-1), offline[:, -1].argmax(-1))
    torch.testing.assert_close(rec.scores(state), offline[:, -1], rtol=0, atol=1e-4)


def test_state_dtype_validation() -> None:
    model = DLRModel(make("tokens"), seed=0)
    with pytest.raises(ValueError, match="complex64 or complex128"):
        to_recurrent(model, dtype=torch.float32)
