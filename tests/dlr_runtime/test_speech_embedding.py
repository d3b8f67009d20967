"""The speech-embedding front end (dlr_runtime/speech_embedding.py) in every form.

- its whole-stream pass (`from_audio`, used offline and in training) == the per-window
  reference (`forward`, used by the recurrent form) in float64 to 1e-10 of the output scale;
- a model with it: offline == chunk (boundaries inside frames) == step == the plain loop of
  `reference_forward`, float64 / complex128 to 1e-10; float32 / complex64 to 1e-4 (observed
  ~1e-6: the 512-long DFT and twenty convolutions in float32);
- against openWakeWord's ONNX graphs run by onnxruntime, the source of its weights, where
  openWakeWord 0.5.1's files are installed (`pip install --no-deps openwakeword==0.5.1`);
- the config and the kws recipe fix its framing and refuse another.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from dlr_runtime import DLRConfig, DLRModel, reference_forward, to_recurrent
from dlr_runtime.model import frames_of
from dlr_runtime.speech_embedding import (
    EMBED_DIM,
    EMBED_FRAMES,
    EMBED_STRIDE,
    EMBED_WINDOW,
    SpeechEmbedding,
)

from .test_frontend import streamed

F64_TOL = 1e-10
F32_TOL = 1e-4
HISTORY = EMBED_WINDOW - EMBED_STRIDE
LABELS = ["yes", "no", "_silence_", "_unknown_"]


def speechlike(batch: int, n: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """Noise bursts at several levels, with quiet gaps: activations in every regime."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, generator=g, dtype=torch.float64)
    env = torch.rand(batch, n // 800 + 1, generator=g, dtype=torch.float64) ** 3
    x = 0.5 * x * env.repeat_interleave(800, dim=1)[:, :n]
    return x.to(dtype)


def config() -> DLRConfig:
    return DLRConfig(
        d_model=8, d_state=6, n_layers=2, encoder="audio", decoder="classifier",
        labels=LABELS, frame_stride=EMBED_STRIDE, frame_window=EMBED_WINDOW,
        frontend="speech_embedding", pool_window_s=0.3, dt_min=0.01, dt_max=0.5,
    )  # fmt: skip


def test_whole_stream_pass_matches_per_window_reference_float64():
    fe = SpeechEmbedding().double()
    x = speechlike(2, EMBED_STRIDE * 14 + 333)
    fast = fe.from_audio(x, HISTORY)  # (2, 14, 96)
    ref = fe(frames_of(x, EMBED_STRIDE, HISTORY))  # (2, 14, 96)
    assert fast.shape == ref.shape == (2, 14, EMBED_DIM)
    scale = ref.abs().max()
    assert scale > 1.0  # the activations are not all clamped
    assert float((fast - ref).abs().max() / scale) < F64_TOL
    # the first frames see the zeros before the start, as a fresh stream does
    assert fe.from_audio(x[:, : EMBED_STRIDE - 1], HISTORY).shape == (2, 0, EMBED_DIM)


def test_frames_differ_and_depend_on_their_window_only():
    fe = SpeechEmbedding().double()
    x = speechlike(1, EMBED_STRIDE * 12, seed=3)
    y = x.clone()
    y[:, : EMBED_STRIDE * 2] = 0.0  # change only audio older than frame 11's window
    a, b = fe.from_audio(x, HISTORY), fe.from_audio(y, HISTORY)
    assert torch.equal(a[:, 11], b[:, 11])
    assert not torch.allclose(a[:, 1], b[:, 1])
    assert not torch.allclose(a[:, 5], a[:, 6])


def test_model_offline_chunk_step_agree_float64():
    model = DLRModel(config(), seed=0).double().eval()
    rec = to_recurrent(model, dtype=torch.complex128, max_block=4)
    x = speechlike(2, EMBED_STRIDE * 9, seed=1)
    with torch.no_grad():
        ref = model(x)  # (2, 9, 4)
    scale = ref.abs().max()
    assert float((reference_forward(model, x) - ref).abs().max() / scale) < F64_TOL
    out = streamed(rec, x, [700, 1280, 5000, 5001], steps_from=9000)  # cuts inside frames
    assert out.shape == ref.shape
    assert float((out - ref).abs().max() / scale) < F64_TOL


def test_model_offline_chunk_agree_float32():
    model = DLRModel(config(), seed=1).eval()
    rec = to_recurrent(model, dtype=torch.complex64)
    x = speechlike(2, EMBED_STRIDE * 12, seed=2, dtype=torch.float32)
    with torch.no_grad():
        ref = model(x)
    state, outs = rec.init_state(2), []
    for s in range(0, x.shape[1], 1600):  # 100 ms chunks, as the server feeds them
        y, state = rec.chunk(x[:, s : s + 1600], state)
        outs.append(y)
    out = torch.cat(outs, dim=1)
    assert float((out - ref).abs().max() / ref.abs().max()) < F32_TOL


def test_config_fixes_the_framing():
    with pytest.raises(ValueError, match="frame_stride 1280"):
        DLRConfig(encoder="audio", decoder="classifier", labels=LABELS, frame_stride=320,
                  frame_window=EMBED_WINDOW, frontend="speech_embedding")  # fmt: skip
    with pytest.raises(ValueError, match="frame_window 12512"):
        DLRConfig(encoder="audio", decoder="classifier", labels=LABELS,
                  frame_stride=EMBED_STRIDE, frontend="speech_embedding")  # fmt: skip
    assert config().feature_dim == EMBED_DIM


def test_weights_are_fixed_data_not_parameters():
    model = DLRModel(config(), seed=0)
    fe = model.encoder.frontend
    assert isinstance(fe, SpeechEmbedding)
    assert not any(n.startswith("encoder.frontend") for n, _ in model.named_parameters())
    assert not any(k.startswith("encoder.frontend") for k in model.state_dict())


def _onnx_dir() -> Path | None:
    spec = importlib.util.find_spec("openwakeword")
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "resources" / "models"
    return d if (d / "embedding_model.onnx").exists() else None


@pytest.mark.skipif(_onnx_dir() is None, reason="openWakeWord 0.5.1's ONNX files not installed")
def test_matches_openwakeword_onnx():
    import onnxruntime as ort

    d = _onnx_dir()
    mel = ort.InferenceSession(str(d / "melspectrogram.onnx"), providers=["CPUExecutionProvider"])
    emb = ort.InferenceSession(str(d / "embedding_model.onnx"), providers=["CPUExecutionProvider"])
    fe = SpeechEmbedding().double()
    x = speechlike(3, EMBED_WINDOW, seed=4)
    ref_mel = mel.run(None, {"input": (x.numpy() * 32767).astype(np.float32)})[0][:, 0]
    ref_mel = ref_mel / 10.0 + 2.0  # (3, 76, 32), as openWakeWord scales it
    ours_mel = fe.mel_frames(x).numpy()
    assert ours_mel.shape == ref_mel.shape == (3, EMBED_FRAMES, 32)
    # above openWakeWord's floor (80 dB under the batch's loudest value) the two agree
    above = ref_mel > ref_mel.min() + 1e-3
    assert above.mean() > 0.9
    assert np.abs(ours_mel - ref_mel)[above].max() < 1e-4
    ref = emb.run(None, {"input_1": ref_mel[..., None].astype(np.float32)})[0].reshape(3, -1)
    ours = fe.stack(torch.from_numpy(ref_mel).double())[:, 0].numpy()
    assert np.abs(ours - ref).max() < 1e-4 * np.abs(ref).max()
