"""The log-mel front end and the exponential-window head in every form of the runtime.

- offline (FFT convolution) == chunk (any boundaries, misaligned with frames) == step, for
  {raw, logmel} x {running mean, exponential window}: float64 / complex128 to 1e-10 of the
  output scale; float32 / complex64 to 1e-4 (the log-mel of a 20 ms frame goes through two
  320-long float32 matmuls and a log; observed ~1e-6 on outputs of magnitude ~1);
- the front end against torchaudio (Spectrogram + melscale_fbanks) as an independent reference;
- `pool_chunk` against a plain loop of `pool_step`, and the running-mean case bit-identical to
  the previous cumsum formula;
- checkpoints keep the new config fields and the detection metadata; old configs still load.
"""

from __future__ import annotations

import json

import pytest
import torch
import torchaudio

from dlr_runtime import (
    DLRConfig,
    DLRModel,
    load_checkpoint,
    load_recurrent,
    save_checkpoint,
    to_recurrent,
)
from dlr_runtime.frontend import LogMel, mel_filterbank, tukey
from dlr_runtime.heads import pool_chunk, pool_step

F64_TOL = 1e-10
F32_TOL = 1e-4
LABELS = ["yes", "no", "_silence_", "_unknown_"]


def config(frontend: str, window: float, stride: int = 40) -> DLRConfig:
    return DLRConfig(
        d_model=8, d_state=6, n_layers=2, encoder="audio", decoder="classifier",
        labels=LABELS, frame_stride=stride, frontend=frontend, n_mels=10, pool_window_s=window,
        dt_min=0.01, dt_max=0.5, sample_rate=16000,
    )  # fmt: skip


def audio(batch: int, n: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (0.3 * torch.randn(batch, n, generator=g, dtype=torch.float64)).to(dtype)


def streamed(rec, x: torch.Tensor, cuts: list[int], steps_from: int | None = None):
    """Chunks at `cuts`; from sample `steps_from` on, one step() per sample."""
    state, outs, prev = rec.init_state(x.shape[0]), [], 0
    stop = x.shape[1] if steps_from is None else steps_from
    for c in [*cuts, stop]:
        if c > prev:
            y, state = rec.chunk(x[:, prev:c], state)
            outs.append(y)
            prev = c
    for t in range(prev, x.shape[1]):
        y, state = rec.step(x[:, t], state)
        if int(state["frame_fill"][0]) == 0:
            outs.append(y.unsqueeze(1))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("frontend", ["raw", "logmel"])
@pytest.mark.parametrize("window", [0.0, 0.01])
def test_offline_chunk_step_agree_float64(frontend, window):
    cfg = config(frontend, window)
    model = DLRModel(cfg, seed=0).double().eval()
    rec = to_recurrent(model, dtype=torch.complex128, max_block=16)
    x = audio(2, 40 * 70)
    with torch.no_grad():
        ref = model(x)  # (2, 70, 4)
    scale = ref.abs().max()
    for cuts, steps_from in (([], None), ([7, 333, 334, 1201], None), ([13, 900], 2400)):
        out = streamed(rec, x, cuts, steps_from)
        assert out.shape == ref.shape
        assert float((out - ref).abs().max() / scale) < F64_TOL
    _, state = rec.chunk(x, rec.init_state(2))
    assert torch.allclose(rec.scores(state), ref[:, -1], atol=F64_TOL * float(scale))


@pytest.mark.parametrize("frontend", ["raw", "logmel"])
def test_offline_chunk_step_agree_float32(frontend):
    cfg = config(frontend, 0.02, stride=320)
    model = DLRModel(cfg, seed=1).eval()
    rec = to_recurrent(model, dtype=torch.complex64)
    x = audio(2, 320 * 50, seed=1, dtype=torch.float32)
    with torch.no_grad():
        ref = model(x)
    out = streamed(rec, x, [1000, 5123], steps_from=320 * 45)
    assert float((out - ref).abs().max() / ref.abs().max()) < F32_TOL


def test_logmel_matches_torchaudio_reference():
    stride, sr, n_mels = 320, 16000, 40
    fe = LogMel(stride, sr, n_mels).double()
    x = audio(1, stride * 12)[0]
    frames = x.reshape(12, stride)
    spec = torchaudio.transforms.Spectrogram(
        n_fft=stride,
        hop_length=stride,
        center=False,
        power=2.0,
        window_fn=lambda n, **_: tukey(n),
        wkwargs=None,
    ).double()(x)  # (F, T)
    fb = torchaudio.functional.melscale_fbanks(
        stride // 2 + 1, 20.0, sr / 2, n_mels, sr, norm=None, mel_scale="htk"
    ).double()  # (F, M)
    ref = fe.compress(spec.T @ fb)  # (T, M)
    # the DFT tables are float32 (cast with the model), hence 1e-6 rather than 1e-12
    assert torch.allclose(fe.power(frames), spec.T, rtol=1e-6, atol=1e-6)
    assert torch.allclose(fe.fbank.double(), fb, atol=1e-5)  # torchaudio builds it in float32
    assert torch.allclose(fe(frames), ref, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fft_power_equals_the_matmul_form(dtype):
    """The eager FFT path and the matmul form the ONNX export traces agree, relative to the
    largest bin: float32 1e-5; float64 1e-6 (the cos/sin tables are built in float32, the
    FFT is exact in float64: ~3e-8 apart)."""
    fe = LogMel(320, 16000, 40).to(dtype)
    frames = audio(7, 320, seed=5, dtype=dtype).reshape(7, 320)
    ref = fe.power_ref(frames)
    got = fe.power(frames)
    assert got.dtype == dtype and got.shape == ref.shape == (7, 161)
    tol = 1e-5 if dtype == torch.float32 else 1e-6
    assert float((got - ref).abs().max() / ref.abs().max()) < tol
    assert fe.power(frames[:0]).shape == (0, 161)


def test_warped_filterbank_moves_filters():
    fe = LogMel(320, 16000, 20)
    up = mel_filterbank(fe.bin_hz * 1.15, 20, fe.f_max)
    peak, peak_up = fe.fbank.argmax(0), up.argmax(0)
    assert (peak_up <= peak).all() and (peak_up < peak).any()  # same filter, lower bin


@pytest.mark.parametrize("decay", [1.0, 0.9, 0.5])
def test_pool_chunk_equals_step_loop(decay):
    g = torch.Generator().manual_seed(0)
    f = torch.randn(3, 300, 5, generator=g, dtype=torch.float64)
    s0 = torch.randn(3, 5, generator=g, dtype=torch.float64)
    c0 = torch.tensor([0.0, 2.0, 7.5], dtype=torch.float64)
    sums, counts = pool_chunk(f, s0, c0, decay)
    s, c = s0, c0
    for t in range(f.shape[1]):
        s, c = pool_step(s, c, f[:, t], decay)
        assert torch.allclose(sums[:, t], s, rtol=1e-12, atol=1e-12)
        assert torch.allclose(counts[:, t], c, rtol=1e-12, atol=1e-12)
    if decay == 1.0:  # the running mean, exactly as before the exponential window existed
        assert torch.equal(sums, s0.unsqueeze(1) + torch.cumsum(f, dim=1))


def test_checkpoint_keeps_frontend_head_labels_and_detection(tmp_path):
    cfg = config("logmel", 0.3, stride=320)
    model = DLRModel(cfg, seed=0)
    detection = {"threshold": 0.8, "smooth_ms": 60.0, "refractory_ms": 900.0}
    save_checkpoint(model, tmp_path / "m", detection=detection)
    back = load_checkpoint(tmp_path / "m")
    assert back.config == cfg and back.config.labels == LABELS
    assert back.checkpoint_metadata["detection"] == detection
    rec = load_recurrent(tmp_path / "m", dtype=torch.complex128)
    x = audio(1, 320 * 20)
    with torch.no_grad():
        ref = model.double()(x)
    y, _ = rec.chunk(x, rec.init_state(1))
    assert float((y - ref).abs().max()) < 1e-9
    save_checkpoint(rec, tmp_path / "r", detection=detection)
    assert load_checkpoint(tmp_path / "r").config.frontend == "logmel"


def test_old_config_without_new_fields_loads(tmp_path):
    cfg = config("raw", 0.0)
    save_checkpoint(DLRModel(cfg, seed=0), tmp_path / "m")
    header = json.loads((tmp_path / "m" / "config.json").read_text())
    for name in ("frontend", "n_mels", "pool_window_s"):
        del header["config"][name]
    (tmp_path / "m" / "config.json").write_text(json.dumps(header))
    back = load_checkpoint(tmp_path / "m")
    assert back.config.frontend == "raw" and back.config.pool_window_s == 0.0


def test_bad_config_values_are_refused():
    with pytest.raises(ValueError, match="frontend"):
        config("mfcc", 0.0)
    with pytest.raises(ValueError, match="pool_window_s"):
        config("raw", -1.0)
