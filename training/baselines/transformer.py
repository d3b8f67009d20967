"""A small causal Transformer (GPT-style, pre-norm) used as the baseline next to DLR.

`TransformerCore` maps (B, L, d) -> (B, L, d) with causal self-attention
(`F.scaled_dot_product_attention(is_causal=True)`) and learned absolute positions up to
`max_len`. `TransformerLM` adds a token embedding and an LM head (the byte-level LM baseline);
`TransformerRegressor` adds linear input/output maps (the synthetic-suite baseline).
`match_width` picks the width whose parameter count is closest to a target, so the baseline
can be sized like the DLR model it is compared with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class TransformerConfig:
    d_model: int = 128  # width
    n_layers: int = 4  # transformer blocks
    n_heads: int = 4  # attention heads (d_model must be divisible)
    max_len: int = 1024  # longest sequence (learned absolute positions)
    mlp_ratio: int = 4  # hidden width of the MLP = mlp_ratio * d_model
    dropout: float = 0.0  # dropout on attention output and MLP output

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        for name in ("d_model", "n_layers", "n_heads", "max_len", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"TransformerConfig.{name} must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)  # 3 x (B, L, d)
        shape = (b, length, self.n_heads, d // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))  # (B, nh, L, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, nh, L, hs)
        return self.proj(y.transpose(1, 2).reshape(b, length, d))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model),
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TransformerCore(nn.Module):
    """(B, L, d) -> (B, L, d): positions + causal blocks + final norm."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.config = cfg
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        length = h.shape[1]
        if length > self.config.max_len:
            raise ValueError(
                f"sequence of {length} exceeds the Transformer's max_len {self.config.max_len}"
            )
        h = h + self.pos(torch.arange(length, device=h.device))  # (B, L, d)
        for layer in self.layers:
            h = layer(h)
        return self.ln_f(h)


class TransformerLM(nn.Module):
    """Tokens (B, L) -> logits (B, L, vocab)."""

    def __init__(self, cfg: TransformerConfig, vocab_size: int) -> None:
        super().__init__()
        self.config = cfg
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.core = TransformerCore(cfg)
        self.head = nn.Linear(cfg.d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.core(self.embed(tokens)))  # (B, L, V)


class TransformerRegressor(nn.Module):
    """Real features (B, L, in) -> (B, L, out)."""

    def __init__(self, cfg: TransformerConfig, in_features: int, out_features: int) -> None:
        super().__init__()
        self.config = cfg
        self.inp = nn.Linear(in_features, cfg.d_model)
        self.core = TransformerCore(cfg)
        self.out = nn.Linear(cfg.d_model, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.core(self.inp(x)))  # (B, L, out)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def match_width(target: int, n_layers: int, n_heads: int, max_len: int, vocab_size: int) -> int:
    """The multiple of n_heads (and 8) whose TransformerLM parameter count is closest to `target`."""
    best, best_gap = n_heads, None
    step = max(8, n_heads)
    for d in range(step, 2049, step):
        if d % n_heads:
            continue
        cfg = TransformerConfig(d_model=d, n_layers=n_layers, n_heads=n_heads, max_len=max_len)
        n = _lm_param_count(cfg, vocab_size)
        gap = abs(n - target)
        if best_gap is None or gap < best_gap:
            best, best_gap = d, gap
        if n > target:
            break
    return best


def _lm_param_count(cfg: TransformerConfig, vocab: int) -> int:
    d, m = cfg.d_model, cfg.mlp_ratio
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (m * d * d + m * d) + (m * d * d + d)
    return vocab * d + cfg.max_len * d + cfg.n_layers * block + 2 * d + d * vocab + vocab
