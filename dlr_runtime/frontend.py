"""Causal audio front ends applied to each frame's window by the audio encoder.

A frame is `frame_stride` samples; the front end sees its *window*: `frame_window` samples
ending with the frame (`DLRConfig.window`; by default the frame alone). A longer window
overlaps the previous frames, so it needs their last `history` samples, which the framing keeps
in the state ("frame_hist", `framing.py`); a stream starts with a history of zeros. (The
speech embedding's recurrent form keeps its convolutions' last rows instead, "embed_cache".)

- ``raw``: the window's samples as they are (the paper's setting: a linear map of raw audio).
- ``logmel``: a log-mel spectrum of the window: a taper (Tukey(0.5) when the window is the
  frame alone, as the first speech models were trained; Hann over an overlapping window, whose
  50 %-overlap sum is flat, so a word delayed by part of a frame scores nearly the same) ->
  real DFT of the window's length (``torch.fft.rfft``; as two matmuls with fixed cos/sin tables
  while tracing for ONNX export, `power_ref`, ~4x slower in eager mode) -> power -> triangular
  mel filterbank (``n_mels`` bands, HTK mel scale, 20 Hz .. Nyquist) -> ``log(mel + 1e-6)``,
  scaled to roughly unit range.
- ``pcen``: the same mel energies without the log (`MelEnergy`); the audio encoder compresses
  them with a causal per-channel energy normalisation (`pcen.py`), which has a state.
- ``logmel_pcen``: the mel energies (`MelEnergy`) compressed both ways, the ``logmel``
  features followed by the PCEN ones (2 * n_mels per frame; `pcen.py`).
- ``speech_embedding``: a frozen network learnt from recorded human speech, 96 numbers every
  80 ms from a 0.78 s window (`speech_embedding.py`).

The front end itself is position-wise with no state: a frame is encoded once its last sample
has arrived, exactly in every form (offline, chunk, step). Every table is a non-persistent
buffer rebuilt from the config, so checkpoints hold no front-end tensors and the front end runs
in the model's dtype (float64 for complex128 state).

`mel_filterbank` takes explicit bin frequencies so training can warp them (vocal-tract-length
perturbation) with the same code.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import PCEN_FRONTENDS, DLRConfig
from .speech_embedding import SpeechEmbedding

LOG_EPS = 1e-6  # floor inside the log: -13.8 for digital silence
LOG_SHIFT = 6.0  # (log(mel) + LOG_SHIFT) / LOG_SCALE keeps speech and silence within ~[-2, 2]
LOG_SCALE = 4.0
F_MIN = 20.0


def log_compress(mel: torch.Tensor) -> torch.Tensor:
    """Mel energies (..., M) -> the log-mel features (..., M), scaled to roughly unit range."""
    return (torch.log(mel + LOG_EPS) + LOG_SHIFT) / LOG_SCALE


def hz_to_mel(f: torch.Tensor | float) -> torch.Tensor:
    return 2595.0 * torch.log10(1.0 + torch.as_tensor(f, dtype=torch.float64) / 700.0)


def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


def mel_filterbank(
    bin_hz: torch.Tensor, n_mels: int, f_max: float, f_min: float = F_MIN
) -> torch.Tensor:
    """Triangular filters (F, M) over DFT bins at frequencies `bin_hz` (F,), float64."""
    edges = mel_to_hz(
        torch.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2, dtype=torch.float64)
    )
    lo, mid, hi = edges[:-2], edges[1:-1], edges[2:]  # (M,) each
    f = bin_hz.to(torch.float64).unsqueeze(-1)  # (F, 1)
    up = (f - lo) / (mid - lo)
    down = (hi - f) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0.0)  # (F, M)


def tukey(n: int, alpha: float = 0.5) -> torch.Tensor:
    """Tukey window (float64): flat middle, cosine tapers over `alpha * n` samples."""
    t = torch.arange(n, dtype=torch.float64) / max(1, n - 1)
    w = torch.ones(n, dtype=torch.float64)
    edge = alpha / 2
    left, right = t < edge, t > 1 - edge
    w[left] = 0.5 * (1 + torch.cos(math.pi * (2 * t[left] / alpha - 1)))
    w[right] = 0.5 * (1 + torch.cos(math.pi * (2 * t[right] / alpha - 2 / alpha + 1)))
    return w


def taper(window: int, stride: int) -> torch.Tensor:
    """The analysis window (float64, (W,)): Tukey(0.5) over a frame alone; else Hann, scaled
    so that white noise gives the same mel energies as the frame-alone Tukey window (a mel
    band spans W / S times as many DFT bins), which keeps features on one scale."""
    if window == stride:
        return tukey(window)
    hann = torch.hann_window(window, periodic=True, dtype=torch.float64)
    gain = tukey(stride).square().sum() * stride / (hann.square().sum() * window)
    return hann * gain.sqrt()


class LogMel(nn.Module):
    """Windows (..., W) -> log-mel features (..., n_mels); position-wise, no state."""

    def __init__(self, window: int, stride: int, sample_rate: int, n_mels: int) -> None:
        super().__init__()
        n_bins = window // 2 + 1
        k = torch.arange(n_bins, dtype=torch.float64)
        t = torch.arange(window, dtype=torch.float64).unsqueeze(-1)
        ang = 2 * math.pi * t * k / window  # (W, F)
        win = taper(window, stride).unsqueeze(-1)
        self.register_buffer("window", win.squeeze(-1).float(), persistent=False)  # (W,)
        self.register_buffer("dft_cos", (win * torch.cos(ang)).float(), persistent=False)
        self.register_buffer("dft_sin", (win * torch.sin(ang)).float(), persistent=False)
        self.bin_hz = k * sample_rate / window  # (F,) float64, for warped filterbanks
        self.f_max = sample_rate / 2
        self.n_mels = n_mels
        fb = mel_filterbank(self.bin_hz, n_mels, self.f_max)
        self.register_buffer("fbank", fb.float(), persistent=False)  # (F, M)

    @property
    def out_dim(self) -> int:
        return self.n_mels

    def power(self, frames: torch.Tensor) -> torch.Tensor:
        """(..., W) -> power spectrum (..., F): an FFT of the tapered window; the matmul
        form `power_ref` while exporting (ONNX graphs hold no FFT here)."""
        if frames.numel() == 0 or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing():
            return self.power_ref(frames)  # (MKL's FFT refuses empty input)
        z = torch.fft.rfft(frames * self.window)
        return z.real * z.real + z.imag * z.imag

    def power_ref(self, frames: torch.Tensor) -> torch.Tensor:
        """`power` as two matmuls with the windowed cos/sin tables."""
        re = frames @ self.dft_cos
        im = frames @ self.dft_sin
        return re * re + im * im

    def compress(self, mel: torch.Tensor) -> torch.Tensor:
        """Mel energies (..., M) -> scaled log (..., M)."""
        return log_compress(mel)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.compress(self.power(frames) @ self.fbank)


class MelEnergy(LogMel):
    """Windows (..., W) -> mel energies (..., n_mels), uncompressed; position-wise, no state."""

    def compress(self, mel: torch.Tensor) -> torch.Tensor:
        return mel


class RawFrames(nn.Module):
    """The identity front end: windows (..., W) -> (..., W)."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.out_dim = window

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return frames


def make_frontend(cfg: DLRConfig) -> nn.Module:
    """The front end named by `cfg.frontend` (it exposes `out_dim`)."""
    if cfg.frontend == "logmel":
        return LogMel(cfg.window, cfg.frame_stride, cfg.sample_rate, cfg.n_mels)
    if cfg.frontend == "speech_embedding":
        return SpeechEmbedding()
    if cfg.frontend in PCEN_FRONTENDS:
        return MelEnergy(cfg.window, cfg.frame_stride, cfg.sample_rate, cfg.n_mels)
    return RawFrames(cfg.window)
