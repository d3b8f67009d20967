"""The log-mel front end, the exponential-window head and the feature normalisation in every
form of the runtime.

- offline (FFT convolution) == chunk (any boundaries, misaligned with frames) == step == the
  plain loop of `reference_forward`, for {raw, logmel, pcen, logmel_pcen} x {running mean, exponential window} x
  {frame alone, overlapping windows} x {with, without feature normalisation}: float64 / complex128 to 1e-10 of the
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
    reference_forward,
    save_checkpoint,
    to_recurrent,
)
from dlr_runtime.frontend import LogMel, mel_filterbank, taper, tukey
from dlr_runtime.heads import pool_chunk, pool_step
from dlr_runtime.model import frames_of

F64_TOL = 1e-10
F32_TOL = 1e-4
LABELS = ["yes", "no", "_silence_", "_unknown_"]


def config(
    frontend: str, window: float, stride: int = 40, frame_window: int = 0, norm: float = 0.0
) -> DLRConfig:
    return DLRConfig(
        d_model=8, d_state=6, n_layers=2, encoder="audio", decoder="classifier",
        labels=LABELS, frame_stride=stride, frontend=frontend, n_mels=10, pool_window_s=window,
        dt_min=0.01, dt_max=0.5, sample_rate=16000, frame_window=frame_window,
        feature_norm_s=norm,
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


@pytest.mark.parametrize("frontend", ["raw", "logmel", "pcen", "logmel_pcen"])
@pytest.mark.parametrize("window", [0.0, 0.01])
@pytest.mark.parametrize("frame_window", [0, 53, 80], ids=["frame", "window+13", "window+40"])
@pytest.mark.parametrize("norm", [0.0, 0.02], ids=["", "feature-norm"])
def test_offline_chunk_step_agree_float64(frontend, window, frame_window, norm):
    cfg = config(frontend, window, frame_window=frame_window, norm=norm)
    model = DLRModel(cfg, seed=0).double().eval()
    rec = to_recurrent(model, dtype=torch.complex128, max_block=16)
    x = audio(2, 40 * 70)
    with torch.no_grad():
        ref = model(x)  # (2, 70, 4)
    scale = ref.abs().max()
    # the plain loop (feature normalisation and pooling as loops of their recurrences) is the
    # specification
    assert float((reference_forward(model, x) - ref).abs().max() / scale) < F64_TOL
    for cuts, steps_from in (([], None), ([7, 333, 334, 1201], None), ([13, 900], 2400)):
        out = streamed(rec, x, cuts, steps_from)
        assert out.shape == ref.shape
        assert float((out - ref).abs().max() / scale) < F64_TOL
    _, state = rec.chunk(x, rec.init_state(2))
    assert torch.allclose(rec.scores(state), ref[:, -1], atol=F64_TOL * float(scale))


@pytest.mark.parametrize("frontend", ["raw", "logmel", "pcen", "logmel_pcen"])
@pytest.mark.parametrize("frame_window", [0, 640])
@pytest.mark.parametrize("norm", [0.0, 0.5], ids=["", "feature-norm"])
def test_offline_chunk_step_agree_float32(frontend, frame_window, norm):
    check_float32(config(frontend, 0.02, stride=320, frame_window=frame_window, norm=norm))


def check_float32(cfg: DLRConfig) -> None:
    """Float32 / complex64: chunks and steps of 20 ms frames against offline, to F32_TOL."""
    model = DLRModel(cfg, seed=1).eval()
    rec = to_recurrent(model, dtype=torch.complex64)
    x = audio(2, 320 * 50, seed=1, dtype=torch.float32)
    with torch.no_grad():
        ref = model(x)
    out = streamed(rec, x, [1000, 5123], steps_from=320 * 45)
    assert float((out - ref).abs().max() / ref.abs().max()) < F32_TOL


def test_logmel_matches_torchaudio_reference():
    stride, sr, n_mels = 320, 16000, 40
    fe = LogMel(stride, stride, sr, n_mels).double()
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


def test_overlapping_logmel_matches_torchaudio_reference():
    """40 ms Hann windows every 20 ms: torchaudio's Spectrogram over the stream with the first
    window's missing history as zeros, the scaled Hann window of `taper`."""
    stride, win, sr, n_mels = 320, 640, 16000, 40
    fe = LogMel(win, stride, sr, n_mels).double()
    x = audio(1, stride * 12)[0]
    spec = torchaudio.transforms.Spectrogram(
        n_fft=win,
        hop_length=stride,
        center=False,
        power=2.0,
        window_fn=lambda n, **_: taper(n, stride),
        wkwargs=None,
    ).double()(torch.nn.functional.pad(x, (win - stride, 0)))  # (F, T)
    fb = torchaudio.functional.melscale_fbanks(
        win // 2 + 1, 20.0, sr / 2, n_mels, sr, norm=None, mel_scale="htk"
    ).double()
    windows = frames_of(x.unsqueeze(0), stride, win - stride)[0]  # (12, 640)
    assert spec.shape[1] == windows.shape[0] == 12
    assert torch.allclose(fe.power(windows), spec.T, rtol=1e-6, atol=1e-6)
    assert torch.allclose(fe(windows), fe.compress(spec.T @ fb), atol=1e-4)


def test_overlapping_window_keeps_the_feature_scale():
    """White noise: the mean mel energies of 40 ms Hann windows match the 20 ms Tukey frames'
    (bands 20-39 within 5 %; the narrower low bands, where a triangle covers a few 50 Hz bins
    of the 20 ms frame and the sum of its weights depends on where they fall, within 25 %), so
    a model trained on the frames can be fine-tuned on the windows without a jump in its
    inputs."""
    x = audio(1, 16000 * 8, seed=3, dtype=torch.float32)
    frame, window = LogMel(320, 320, 16000, 40), LogMel(640, 320, 16000, 40)
    e_frame = (frame.power(frames_of(x, 320, 0)) @ frame.fbank)[0]  # (400, 40)
    e_window = (window.power(frames_of(x, 320, 320)) @ window.fbank)[0, 1:]  # (399, 40)
    ratio = e_window.mean(0) / e_frame.mean(0)  # per band
    assert float((ratio[20:] - 1).abs().max()) < 0.05
    assert float((ratio - 1).abs().max()) < 0.25
    assert float(window.compress(e_window).std(0).mean()) < float(
        frame.compress(e_frame).std(0).mean()
    )  # a longer window: a steadier estimate


def test_a_shift_inside_a_frame_moves_overlapping_features_less():
    """The reason for overlapping windows: a sound delayed by half a frame changes the 20 ms
    frames' log-mel more than the 40 ms windows' (a tone burst, 10 ms shift)."""
    t = torch.arange(16000 * 2, dtype=torch.float64) / 16000
    env = ((t > 0.5) & (t < 0.56)).double()
    burst = (0.3 * torch.sin(2 * 3.14159 * 700 * t) * env).float().unsqueeze(0)
    shifted = torch.nn.functional.pad(burst, (160, 0))[:, : burst.shape[1]]

    def change(win: int) -> float:
        fe = LogMel(win, 320, 16000, 40)
        a = fe(frames_of(burst, 320, win - 320)).exp()
        b = fe(frames_of(shifted, 320, win - 320)).exp()
        return float((a.sum(-1) - b.sum(-1)).abs().max())  # energy envelope over time

    assert change(640) < 0.7 * change(320)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fft_power_equals_the_matmul_form(dtype):
    """The eager FFT path and the matmul form the ONNX export traces agree, relative to the
    largest bin: float32 1e-5; float64 1e-6 (the cos/sin tables are built in float32, the
    FFT is exact in float64: ~3e-8 apart)."""
    fe = LogMel(320, 320, 16000, 40).to(dtype)
    frames = audio(7, 320, seed=5, dtype=dtype).reshape(7, 320)
    ref = fe.power_ref(frames)
    got = fe.power(frames)
    assert got.dtype == dtype and got.shape == ref.shape == (7, 161)
    tol = 1e-5 if dtype == torch.float32 else 1e-6
    assert float((got - ref).abs().max() / ref.abs().max()) < tol
    assert fe.power(frames[:0]).shape == (0, 161)


def test_warped_filterbank_moves_filters():
    fe = LogMel(320, 320, 16000, 20)
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
    with pytest.raises(ValueError, match="frame_window"):
        config("logmel", 0.0, frame_window=39)  # shorter than the frame
    with pytest.raises(ValueError, match="frame_window"):
        DLRConfig.preset("micro-lm", frame_window=8)  # tokens have no frames


def test_frame_window_round_trips_and_is_left_out_when_off(tmp_path):
    """Configs without overlapping windows serialise as before (so existing checkpoints and
    the snapshot hashes made from their configs are unchanged); with them, the checkpoint
    keeps the window and the state gains the history."""
    plain = config("logmel", 0.0)
    assert "frame_window" not in plain.to_dict()
    assert DLRConfig.from_dict(plain.to_dict()) == plain
    cfg = config("logmel", 0.0, frame_window=80)
    assert cfg.to_dict()["frame_window"] == 80 and (cfg.window, cfg.history) == (80, 40)
    save_checkpoint(DLRModel(cfg, seed=0), tmp_path / "m")
    rec = load_recurrent(tmp_path / "m")
    assert rec.config == cfg
    assert rec.init_state(1)["frame_hist"].shape == (1, 40)
    assert "frame_hist" not in to_recurrent(DLRModel(plain, seed=0)).init_state(1)
