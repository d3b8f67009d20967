"""A frozen speech-embedding front end learnt from recorded human speech.

The network is Google's speech_embedding (Apache-2.0; Lin et al., "Training keyword spotters
with limited and synthesized speech data", arXiv:2002.01322), as re-implemented in ONNX by
openWakeWord: a 32-band log-mel spectrum (512-sample DFT every 10 ms, 60 Hz .. ~3.8 kHz),
then a stack of small convolutions over 76 mel frames (0.775 s) giving 96 numbers. Its
weights are fixed data, shipped in `assets/speech_embedding.safetensors` (made once by
`training/data/speech_embedding_asset.py`; see `assets/NOTICE.md`), loaded into non-persistent
buffers, so no checkpoint holds them and no optimiser sees them.

As a front end it is position-wise, like the others (`frontend.py`): a frame of
`EMBED_STRIDE` samples (80 ms, the network's own hop) is encoded from its window of
`EMBED_WINDOW` samples, the frame and the 0.7 s before it.

Three forms, equal to float rounding (tests/dlr_runtime/test_speech_embedding*.py):
- ``forward(frames)``: the reference, each window (..., EMBED_WINDOW) on its own;
- ``from_audio(audio)``: whole streams at once, used offline and in training. The
  convolutions have no padding in time and their pooling divides time by exactly 8 mel
  frames, which is one frame stride, so running the stack over a stream's whole mel spectrum
  gives every frame's embedding in one pass, sharing the 9.5 windows' worth of overlap each
  frame would otherwise recompute;
- `speech_embedding_stream.EmbeddingStream`: the recurrent form's, frame by frame from each
  convolution's last rows kept in the session state (instead of 0.7 s of audio).

One change from openWakeWord's copy: its mel stage floors the decibels at 80 dB under the
loudest value *of the whole input*, which no causal front end can know; here the floor is a
fixed `DB_FLOOR`, under which only near-digital silence falls.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from .config import EMBED_DIM, EMBED_STRIDE, EMBED_WINDOW

ASSET = Path(__file__).parent / "assets" / "speech_embedding.safetensors"
N_FFT = 512  # samples per mel frame's DFT
MEL_HOP = 160  # samples between mel frames (10 ms)
N_MELS = 32
EMBED_FRAMES = 76  # mel frames per embedding
EMBED_HOP = 8  # mel frames between embeddings: the stack's pooling in time (2 x 2 x 2)
assert EMBED_STRIDE == EMBED_HOP * MEL_HOP  # 1280 samples: 80 ms at 16 kHz
assert EMBED_WINDOW == N_FFT + (EMBED_FRAMES - 1) * MEL_HOP  # 12,512 samples it sees
INT16 = 32767.0  # the network was trained on int16-scaled samples
DB_FLOOR = 0.0  # decibels (of int16-scaled power): the fixed floor (see the docstring)
LEAK = 0.2  # LeakyReLU slope
CLAMP = -0.4  # each activation is max(LeakyReLU(x), CLAMP)
# (name, kind) of the stack, in order: "c<i>" a convolution (its weights `c<i>.weight`,
# `c<i>.bias`), "t" a 2 x 2 max-pool (time and frequency), "f" a 1 x 2 max-pool (frequency).
LAYOUT: tuple[str, ...] = (
    "c0", "c1", "c2", "t", "c3", "c4", "c5", "c6", "f", "c7", "c8", "c9", "c10", "t",
    "c11", "c12", "c13", "c14", "f", "c15", "c16", "c17", "c18", "t", "c19",
)  # fmt: skip


class SpeechEmbedding(nn.Module):
    """Windows (..., EMBED_WINDOW) -> embeddings (..., EMBED_DIM); position-wise, no state."""

    out_dim = EMBED_DIM

    def __init__(self, asset: Path = ASSET) -> None:
        super().__init__()
        w = load_file(str(asset))
        self.register_buffer("stft_re", w["stft_re"], persistent=False)  # (257, 1, N_FFT)
        self.register_buffer("stft_im", w["stft_im"], persistent=False)  # (257, 1, N_FFT)
        self.register_buffer("mel", w["mel"], persistent=False)  # (257, N_MELS)
        self.convs = [k for k in LAYOUT if k.startswith("c")]
        for k in self.convs:
            self.register_buffer(f"{k}_w", w[f"{k}.weight"], persistent=False)
            self.register_buffer(f"{k}_b", w[f"{k}.bias"], persistent=False)

    def mel_frames(self, audio: torch.Tensor) -> torch.Tensor:
        """Samples (B, L) in [-1, 1] -> the network's input (B, (L - N_FFT) // MEL_HOP + 1, 32)."""
        x = (audio * INT16).unsqueeze(1)  # (B, 1, L)
        re = F.conv1d(x, self.stft_re, stride=MEL_HOP)  # (B, 257, T)
        im = F.conv1d(x, self.stft_im, stride=MEL_HOP)
        power = (re * re + im * im).transpose(1, 2) @ self.mel  # (B, T, 32)
        db = 10.0 * torch.log10(power.clamp_min(1e-10)).clamp_min(DB_FLOOR)
        return db / 10.0 + 2.0  # the scaling openWakeWord feeds the network

    def stack(self, mel: torch.Tensor) -> torch.Tensor:
        """Mel frames (B, T, 32) -> embeddings (B, (T - EMBED_FRAMES) // EMBED_HOP + 1, 96)."""
        h = mel.unsqueeze(1)  # (B, 1, T, 32): time is the height
        for k in LAYOUT:
            h = self.layer(k, h)
        return h.squeeze(-1).transpose(1, 2)  # (B, 96, E, 1) -> (B, E, 96)

    def layer(self, k: str, h: torch.Tensor) -> torch.Tensor:
        """One entry `k` of LAYOUT on (B, C, T, F) -> (B, C', T', F'): a convolution (no
        padding in time, so T' = T - height + 1), with its activation unless it is the last,
        or a max-pool."""
        if k == "t":
            return F.max_pool2d(h, (2, 2))
        if k == "f":
            return F.max_pool2d(h, (1, 2))
        weight = getattr(self, f"{k}_w")
        pad = (0, 1) if weight.shape[-1] == 3 else (0, 0)  # frequency only, never time
        h = F.conv2d(h, weight, getattr(self, f"{k}_b"), padding=pad)
        if k != self.convs[-1]:
            h = F.leaky_relu(h, LEAK).clamp_min(CLAMP)
        return h

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """The reference: each window (..., EMBED_WINDOW) on its own -> (..., 96)."""
        lead = frames.shape[:-1]
        flat = frames.reshape(-1, frames.shape[-1])
        if flat.shape[0] == 0:
            return frames.new_zeros(*lead, EMBED_DIM)
        return self.stack(self.mel_frames(flat)).reshape(*lead, EMBED_DIM)

    def from_audio(self, audio: torch.Tensor, history: int) -> torch.Tensor:
        """Whole streams (B, L) from their start -> (B, L // EMBED_STRIDE, 96), each frame's
        embedding as `forward` gives it for the frame's window (zeros before the start)."""
        n = audio.shape[1] // EMBED_STRIDE
        if n == 0:
            return audio.new_zeros(audio.shape[0], 0, EMBED_DIM)
        padded = F.pad(audio[:, : n * EMBED_STRIDE], (history, 0))
        return self.stack(self.mel_frames(padded))
