"""The DLR network in training (FFT-convolution) mode.

    encoder -> n_layers x Block -> final norm -> decoder

Block: [norm if prenorm] -> SSM layer -> GELU -> dropout -> linear (H->2H + GLU, or H->H)
       -> dropout -> residual add -> [norm if postnorm]

Encoders: a token embedding, or an audio frame encoder mapping each full frame of
`frame_stride` samples (seen through its front-end window, which may reach back over earlier
samples: `frame_window`) to H features with one linear map (causal: a frame is encoded once its
last sample has arrived). Decoders: a language-model head at every position, or a classifier
over the causal running mean of the features (mean pooling that can stream).

Everything but the SSM layers is position-wise, so the pieces are shared verbatim with the
recurrent form (`dlr_runtime.recurrent`), which swaps only the SSM computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DLRConfig
from .feature_norm import norm_decay, normalise
from .frontend import make_frontend
from .heads import pool_decay, pooled
from .pcen import PCEN, pcen_decay
from .speech_embedding import SpeechEmbedding
from .ssm import DiagonalSSM, make_layer
from .unknown_head import UnionLinear


def make_norm(cfg: DLRConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.d_model)
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model)
    return nn.Identity()


class BlockPointwise(nn.Module):
    """The position-wise parts of a block: the norms and the output projection."""

    def __init__(self, cfg: DLRConfig) -> None:
        super().__init__()
        self.prenorm = cfg.prenorm
        self.glu = cfg.glu
        self.norm = make_norm(cfg)
        self.out = nn.Linear(cfg.d_model, (2 if cfg.glu else 1) * cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def pre(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) residual stream -> (..., H) input of the SSM layer."""
        return self.norm(h) if self.prenorm else h

    def post(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Residual stream h and SSM output s, both (..., H) -> new residual stream (..., H)."""
        z = self.drop(F.gelu(s))
        z = self.out(z)
        if self.glu:
            z = F.glu(z, dim=-1)
        h = h + self.drop(z)
        return h if self.prenorm else self.norm(h)


class Block(nn.Module):
    def __init__(self, cfg: DLRConfig, gen: torch.Generator | None = None) -> None:
        super().__init__()
        self.pw = BlockPointwise(cfg)
        self.ssm: DiagonalSSM = make_layer(cfg, gen)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, L, H) -> (B, L, H)."""
        return self.pw.post(h, self.ssm(self.pw.pre(h)))


class Encoder(nn.Module):
    """Tokens (B, L) int -> (B, L, H); or audio (B, L) float -> (B, L // stride, H)."""

    def __init__(self, cfg: DLRConfig) -> None:
        super().__init__()
        self.kind = cfg.encoder
        self.stride = cfg.frame_stride
        self.history = cfg.history
        if cfg.encoder == "tokens":
            self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        else:
            self.frontend = make_frontend(cfg)  # raw samples or mel features, per window (no state)
            self.frame = nn.Linear(cfg.feature_dim, cfg.d_model)
            self.norm_decay = norm_decay(cfg)  # 0.0: no feature normalisation (no state)
            decay = pcen_decay(cfg)  # 0.0: no PCEN (no state)
            with_log = cfg.frontend == "logmel_pcen"  # PCEN's output after the log-mel features
            self.pcen = PCEN(cfg.n_mels, decay, with_log) if decay else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "tokens":
            return self.embed(x)
        if isinstance(self.frontend, SpeechEmbedding):  # every frame's window in one pass
            return self.embed_features(self.frontend.from_audio(x, self.history))
        return self.embed_features(self.frontend(frames_of(x, self.stride, self.history)))

    def embed_features(self, feats: torch.Tensor) -> torch.Tensor:
        """Front-end features of whole streams (B, T, F), from their start -> (B, T, H)."""
        if self.pcen is not None:
            feats = self.pcen(feats)  # mel energies -> PCEN (B, T, M), [log-mel, PCEN] (B, T, 2M)
        if self.norm_decay:
            feats = normalise(feats, self.norm_decay)
        return self.frame(feats)

    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """Audio frame windows (..., W) -> (..., H), frame by frame: only for a front end
        without state (no PCEN or feature normalisation; the recurrent form carries that state)."""
        if self.norm_decay or self.pcen is not None:
            raise ValueError("encode_frames has no front-end state (PCEN, feature normalisation)")
        return self.frame(self.frontend(frames))


def frames_of(audio: torch.Tensor, stride: int, history: int = 0) -> torch.Tensor:
    """(B, L) samples -> windows (B, L // stride, history + stride): frame t's samples after
    the `history` samples before it (zeros before the stream's start); a trailing partial
    frame has no output yet."""
    n = audio.shape[1] // stride
    if history == 0 or n == 0:
        return audio[:, : n * stride].reshape(audio.shape[0], n, history + stride)
    padded = F.pad(audio[:, : n * stride], (history, 0))  # (B, history + n * stride)
    return padded.unfold(1, history + stride, stride)  # (B, n, W)


class Head(nn.Module):
    """Final norm and decoder: LM logits, or class scores of the running mean."""

    def __init__(self, cfg: DLRConfig) -> None:
        super().__init__()
        self.kind = cfg.decoder
        self.norm = make_norm(cfg) if cfg.prenorm else nn.Identity()
        self.proj = (
            UnionLinear(cfg.d_model, cfg.n_classes, cfg.unknown_classes)
            if cfg.unknown_classes
            else nn.Linear(cfg.d_model, cfg.out_dim)
        )  # (H -> out_dim; the last label a union of classes: unknown_head.py)
        self.decay = pool_decay(cfg) if cfg.decoder == "classifier" else 1.0

    def features(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)

    def scored_features(self, h: torch.Tensor) -> torch.Tensor:
        """(B, L, H) -> (B, L, H): what `proj` scores at every position (for a classifier the
        causal running mean or exponential window of the normed features)."""
        f = self.features(h)
        if self.kind == "classifier":
            f = pooled(f, self.decay)
        return f

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(B, L, H) -> (B, L, out_dim): at every position, causally."""
        return self.proj(self.scored_features(h))


class DLRModel(nn.Module):
    """The whole network; `forward` computes every position at once (training mode)."""

    def __init__(self, cfg: DLRConfig, seed: int | None = None) -> None:
        super().__init__()
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        if seed is not None:
            torch.manual_seed(seed)
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.blocks = nn.ModuleList(Block(cfg, gen) for _ in range(cfg.n_layers))
        self.head = Head(cfg)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """Input (B, L) -> last residual stream (B, L', H) (L' = L // stride for audio)."""
        h = self.encoder(x)
        for block in self.blocks:
            h = block(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Input (B, L) -> (B, L', out_dim): LM logits or running-mean class scores."""
        return self.head(self.hidden(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
