"""Model configuration: one dataclass that fully describes a DLR network.

The config is stored inside every checkpoint (as JSON), so a checkpoint needs nothing else
to be loaded. `DLRConfig.from_dict(cfg.to_dict()) == cfg` always holds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

LayerKind = Literal["dlr", "s4d", "lru"]
InitKind = Literal["omega", "random"]
NormKind = Literal["layernorm", "rmsnorm", "none"]
EncoderKind = Literal["tokens", "audio"]
DecoderKind = Literal["lm", "classifier"]
FrontendKind = Literal["raw", "logmel"]


@dataclass
class DLRConfig:
    d_model: int = 128  # H: features per position (width of every block)
    d_state: int = 64  # N: complex state modes per feature in every layer
    n_layers: int = 4  # number of residual blocks
    layer: LayerKind = "dlr"  # how a layer is parameterised: dlr (the paper), s4d (ZOH), lru
    shared_lambda: bool = True  # lambda of shape [N] shared by all H features (paper) vs [H, N]
    init: InitKind = "omega"  # omega: roots of unity pulled inside the circle; random phases
    dt_min: float = 1e-4  # smallest per-mode decay step of the init (|lambda| = exp(-dt/2))
    dt_max: float = 1e-1  # largest per-mode decay step of the init
    norm: NormKind = "layernorm"  # per-position norm (no batch statistics: stays causal)
    prenorm: bool = True  # norm before the layer (True) or after the residual add (False)
    glu: bool = True  # output projection H -> 2H followed by a GLU, else a plain H -> H linear
    dropout: float = 0.0  # dropout after the activation and the projection (training only)
    encoder: EncoderKind = "tokens"  # tokens: embedding table; audio: real-valued samples
    vocab_size: int = 258  # tokens: size of the embedding table and of the LM head
    sample_rate: int = 16000  # audio: samples per second the model consumes
    frame_stride: int = 1  # audio: samples per frame; a causal linear map of each full frame
    decoder: DecoderKind = "lm"  # lm: logits at every position; classifier: running-mean head
    labels: list[str] = field(default_factory=list)  # classifier: class names (n_classes)
    frontend: FrontendKind = "raw"  # audio: per-frame front end (raw | logmel), frontend.py
    n_mels: int = 40  # audio, logmel front end: mel bands per frame
    pool_window_s: float = 0.0  # classifier: 0 = running mean; > 0 = exp. window (s), heads.py

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field."""
        positive = ("d_model", "d_state", "n_layers", "vocab_size", "sample_rate", "frame_stride")
        positive += ("n_mels",)
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DLRConfig.{name} must be a positive integer, got {value!r}")
        choices = {
            "layer": ("dlr", "s4d", "lru"),
            "init": ("omega", "random"),
            "norm": ("layernorm", "rmsnorm", "none"),
            "encoder": ("tokens", "audio"),
            "decoder": ("lm", "classifier"),
            "frontend": ("raw", "logmel"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"DLRConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(
                f"DLRConfig needs 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"DLRConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.decoder == "classifier" and len(self.labels) < 2:
            raise ValueError("DLRConfig.labels needs at least two class names for a classifier")
        if self.encoder == "audio" and self.decoder != "classifier":
            raise ValueError("DLRConfig: the audio encoder goes with the classifier decoder")
        if self.pool_window_s < 0:
            raise ValueError(f"DLRConfig.pool_window_s must be >= 0, got {self.pool_window_s}")
        if self.encoder == "tokens" and self.frame_stride != 1:
            raise ValueError("DLRConfig.frame_stride applies to the audio encoder only")

    @property
    def n_classes(self) -> int:
        return len(self.labels)

    @property
    def out_dim(self) -> int:
        """Size of the last axis of the model's output (logits or class scores)."""
        return self.vocab_size if self.decoder == "lm" else self.n_classes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DLRConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown DLRConfig fields: {unknown}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> DLRConfig:
        return cls.from_dict(json.loads(text))
