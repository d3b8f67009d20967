"""The speech embedding frame by frame, keeping each convolution's last rows instead of audio.

`SpeechEmbedding.forward` (the reference) encodes each 80 ms frame from its whole 0.78 s
window, so a live stream recomputes 76 mel frames and the whole convolution stack for every
8 new mel frames. The stack needs much less: its convolutions have no padding in time (a
convolution of height 3 needs the 2 input rows before the new ones, one of height 1 none),
and its three time pools halve 8 new rows to 4, 2 and 1, always in whole pairs. So the stream
keeps, per session,

    the last N_FFT - MEL_HOP = 352 samples (the overlap of the next mel frame's DFT), and
    the last 2 input rows of each height-3 convolution, (C_in, 2, F_in) each,

and computes each new frame from its own 1,280 samples: 8 mel frames instead of 76, and the
same fraction of every convolution. That cache (`cache_size()` numbers, ~9,800) is also
smaller than the 11,232 samples of history the windows need.

A stream starts from a window of zeros. Its cache is then not zero (the mel stage floors
silence at a constant, and every layer maps constant rows to constant rows), so the state
holds the cache *minus* that start (`start`), making the zero state the start of a stream
like every other state tensor (`state_spec.init_state`).

Equal to the reference to float rounding (tests/dlr_runtime/test_speech_embedding_stream.py).
"""

from __future__ import annotations

import copy
from functools import cache

import torch
from safetensors import safe_open
from torch import nn

from .config import EMBED_DIM, EMBED_STRIDE
from .speech_embedding import ASSET, LAYOUT, MEL_HOP, N_FFT, N_MELS, SpeechEmbedding

AUDIO_KEEP = N_FFT - MEL_HOP  # 352 samples: the next mel frame's DFT starts this far back
AUDIO = "audio"  # the cache entry of the kept samples


@cache
def cache_layout() -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(entry, shape) of the cache in its packed order: the kept samples, then the 2 rows
    before the new ones at the input of every convolution of height 3, (C_in, 2, F_in)."""
    out: list[tuple[str, tuple[int, ...]]] = [(AUDIO, (AUDIO_KEEP,))]
    freq = N_MELS
    with safe_open(str(ASSET), "pt") as f:
        for k in LAYOUT:
            if k in ("t", "f"):
                freq //= 2
                continue
            _, c_in, height, _ = f.get_slice(f"{k}.weight").get_shape()
            if height > 1:
                assert height == 3  # (the stack's only heights: 1 and 3)
                out.append((k, (c_in, height - 1, freq)))
    return tuple(out)


def cache_size() -> int:
    """Numbers in one stream's packed cache."""
    return sum(torch.Size(shape).numel() for _, shape in cache_layout())


def unpack(cache: torch.Tensor) -> dict[str, torch.Tensor]:
    """Packed caches (B, K) -> entry -> (B, *shape)."""
    out, at = {}, 0
    for name, shape in cache_layout():
        n = torch.Size(shape).numel()
        out[name] = cache[:, at : at + n].reshape(cache.shape[0], *shape)
        at += n
    return out


def pack(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    """entry -> (B, *shape) -> packed caches (B, K)."""
    return torch.cat([parts[name].flatten(1) for name, _ in cache_layout()], dim=1)


class EmbeddingStream(nn.Module):
    """Frames (B, T, EMBED_STRIDE) and caches (B, K) -> embeddings (B, T, 96), new caches."""

    def __init__(self, embedding: SpeechEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        dtype = embedding.mel.dtype
        ref = copy.deepcopy(embedding).cpu().double()  # (its weights, not the file read again)
        zeros = torch.zeros(1, 2, EMBED_STRIDE, dtype=torch.float64)  # 2: a row at every level
        start = self._run(ref, zeros, None)
        self.register_buffer("start", start[1].to(dtype), persistent=False)  # (1, K)

    def forward(
        self, frames: torch.Tensor, cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`cache` as the state holds it (minus `start`); returns the new one the same way."""
        if frames.shape[1] == 0:  # no whole frame yet: nothing to encode, the cache as it is
            return frames.new_zeros(frames.shape[0], 0, EMBED_DIM), cache
        feats, rows = self._run(self.embedding, frames, cache + self.start)
        return feats, rows - self.start

    @staticmethod
    def _run(
        emb: SpeechEmbedding, frames: torch.Tensor, rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stack over T new frames after cached `rows` (B, K); None: a stream of zeros
        so far, each layer's input rows made from zeros (constant in time, so the new rows'
        last ones are the cache of a stream that saw only zeros)."""
        b, t, _ = frames.shape
        new = frames.reshape(b, -1)  # (B, T * S)
        if rows is None:
            audio = torch.cat([new.new_zeros(b, AUDIO_KEEP), new], dim=1)
        else:
            parts = unpack(rows)
            audio = torch.cat([parts[AUDIO], new], dim=1)  # (B, 352 + T * S)
        kept = {AUDIO: audio[:, -AUDIO_KEEP:]}
        layout = dict(cache_layout())
        h = emb.mel_frames(audio).unsqueeze(1)  # (B, 1, 8T, 32)
        for k in LAYOUT:
            if k in layout:  # a convolution of height 3: the 2 rows before the new ones
                before = h[:, :, :2] if rows is None else parts[k]  # (B, C, 2, F)
                h = torch.cat([before, h], dim=2)
                kept[k] = h[:, :, -2:]
            h = emb.layer(k, h)
        feats = h.squeeze(-1).transpose(1, 2)  # (B, 96, T, 1) -> (B, T, 96)
        return feats, pack(kept)
