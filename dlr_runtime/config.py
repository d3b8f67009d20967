"""Model configuration: one dataclass that fully describes a DLR network.

The config is stored inside every checkpoint (as JSON), so a checkpoint needs nothing else
to be loaded. `DLRConfig.from_dict(cfg.to_dict()) == cfg` always holds.

Named presets (`DLRConfig.preset("tiny-lm", n_layers=1)`) give tests and benchmarks one
definition of each small model they build (`PRESETS` lists them).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, get_args

LayerKind = Literal["dlr", "s4d", "lru"]
InitKind = Literal["omega", "random"]
NormKind = Literal["layernorm", "rmsnorm", "none"]
EncoderKind = Literal["tokens", "audio"]
DecoderKind = Literal["lm", "classifier"]
FrontendKind = Literal["raw", "logmel", "pcen", "logmel_pcen", "speech_embedding"]
FRONTENDS: tuple[FrontendKind, ...] = get_args(FrontendKind)
PCEN_FRONTENDS = ("pcen", "logmel_pcen")  # the front ends with a PCEN stage (pcen.py)
# The speech embedding's fixed framing at 16 kHz (speech_embedding.py): an 80 ms frame (its
# hop of 8 mel frames of 160 samples) seen through 76 mel frames' window, 96 features out.
EMBED_STRIDE = 1280
EMBED_WINDOW = 512 + 75 * 160  # 12,512 samples
EMBED_DIM = 96

SC10_LABELS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
_SPEECH = {"encoder": "audio", "decoder": "classifier", "sample_rate": 16000, "frame_stride": 160}
PRESETS: dict[str, dict[str, Any]] = {
    # tests: seconds on a CPU
    "tiny-lm": {"d_model": 16, "d_state": 8, "n_layers": 2, "vocab_size": 258, "init": "random"},
    "tiny-speech": {"d_model": 16, "d_state": 8, "n_layers": 2, **_SPEECH, "labels": SC10_LABELS},
    "micro-lm": {"d_model": 8, "d_state": 4, "n_layers": 2, "vocab_size": 20},
    "micro-speech": {"d_model": 8, "d_state": 4, "n_layers": 1, **_SPEECH, "labels": ["a", "b"]},
    # benchmarks
    "bench-lm": {"d_model": 128, "d_state": 32, "n_layers": 4, "vocab_size": 258},
    "bench-speech": {"d_model": 64, "d_state": 32, "n_layers": 4, **_SPEECH, "labels": SC10_LABELS},
    "decode-lm": {"d_model": 256, "d_state": 64, "n_layers": 4, "vocab_size": 258},
    "roofline-speech": {
        "d_model": 64,
        "d_state": 64,
        "n_layers": 4,
        **_SPEECH,
        "labels": SC10_LABELS,
    },  # fmt: skip
    "byte-lm": {"d_model": 192, "d_state": 64, "n_layers": 4, "vocab_size": 258},  # shipped shape
}

_LATER: dict[str, Any] = {
    "frame_window": 0,
    "feature_norm_s": 0.0,
    "min_decay": 0.0,
    "unknown_classes": 0,
}  # field -> "not used" value


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
    min_decay: float = 0.0  # dlr layers: every mode decays by at least this per step,
    # Re Lambda = -(p^2 + min_decay), so |lambda| <= exp(-min_decay) and no mode's time
    # constant exceeds 1 / min_decay steps; 0 = the paper's (no bound)
    norm: NormKind = "layernorm"  # per-position norm (no batch statistics: stays causal)
    prenorm: bool = True  # norm before the layer (True) or after the residual add (False)
    glu: bool = True  # output projection H -> 2H followed by a GLU, else a plain H -> H linear
    dropout: float = 0.0  # dropout after the activation and the projection (training only)
    encoder: EncoderKind = "tokens"  # tokens: embedding table; audio: real-valued samples
    vocab_size: int = 258  # tokens: size of the embedding table and of the LM head
    sample_rate: int = 16000  # audio: samples per second the model consumes
    frame_stride: int = 1  # audio: samples per frame; a causal linear map of each full frame
    frame_window: int = 0  # audio: samples the front end sees per frame (0 = frame_stride;
    # more: the frame plus the end of the previous ones, overlapping windows; frontend.py)
    decoder: DecoderKind = "lm"  # lm: logits at every position; classifier: running-mean head
    labels: list[str] = field(default_factory=list)  # classifier: class names (n_classes)
    frontend: FrontendKind = "raw"  # audio: per-frame front end (raw | logmel | pcen |
    # logmel_pcen), frontend.py; pcen: mel energies through a causal, trainable PCEN (pcen.py);
    # logmel_pcen: the log-mel features and the PCEN ones side by side (2 * n_mels);
    # speech_embedding: a frozen network learnt from recorded speech (speech_embedding.py),
    # which fixes frame_stride 1280 and frame_window 12512 at 16 kHz (EMBED_*)
    n_mels: int = 40  # audio, mel front ends: mel bands per frame
    pool_window_s: float = 0.0  # classifier: 0 = running mean; > 0 = exp. window (s), heads.py
    feature_norm_s: float = 0.0  # audio: subtract the causal exp. mean (time constant, s) of
    # each front-end feature before the frame map; 0 = off (feature_norm.py)
    unknown_classes: int = 0  # classifier: the last label is the union of this many classes,
    # each with its own row of the projection (unknown_head.py); 0 = one row, as every label

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
            "frontend": FRONTENDS,
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
        if not 0.0 <= self.min_decay < 1.0:
            raise ValueError(f"DLRConfig.min_decay must be in [0, 1), got {self.min_decay}")
        if self.min_decay and self.layer != "dlr":
            raise ValueError("DLRConfig.min_decay applies to the dlr layer only")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"DLRConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.decoder == "classifier" and len(self.labels) < 2:
            raise ValueError("DLRConfig.labels needs at least two class names for a classifier")
        if self.encoder == "audio" and self.decoder != "classifier":
            raise ValueError("DLRConfig: the audio encoder goes with the classifier decoder")
        if not isinstance(self.unknown_classes, int) or self.unknown_classes < 0:
            raise ValueError(
                f"DLRConfig.unknown_classes must be an integer >= 0, got {self.unknown_classes!r}"
            )
        if self.unknown_classes and self.decoder != "classifier":
            raise ValueError("DLRConfig.unknown_classes applies to the classifier decoder only")
        if self.pool_window_s < 0:
            raise ValueError(f"DLRConfig.pool_window_s must be >= 0, got {self.pool_window_s}")
        if self.feature_norm_s < 0:
            raise ValueError(f"DLRConfig.feature_norm_s must be >= 0, got {self.feature_norm_s}")
        if self.encoder == "tokens" and self.feature_norm_s:
            raise ValueError("DLRConfig.feature_norm_s applies to the audio encoder only")
        if self.encoder == "tokens" and self.frontend != "raw":
            raise ValueError("DLRConfig.frontend applies to the audio encoder only")
        if self.encoder == "tokens" and self.frame_stride != 1:
            raise ValueError("DLRConfig.frame_stride applies to the audio encoder only")
        if self.encoder == "tokens" and self.frame_window != 0:
            raise ValueError("DLRConfig.frame_window applies to the audio encoder only")
        if self.frame_window != 0 and (
            not isinstance(self.frame_window, int) or self.frame_window < self.frame_stride
        ):
            raise ValueError(
                "DLRConfig.frame_window must be 0 or an integer >= frame_stride "
                f"({self.frame_stride}), got {self.frame_window!r}"
            )

        if self.frontend == "speech_embedding":
            fixed = {
                "sample_rate": 16000,
                "frame_stride": EMBED_STRIDE,
                "frame_window": EMBED_WINDOW,
            }
            for name, value in fixed.items():
                if getattr(self, name) != value:
                    raise ValueError(
                        f"DLRConfig.frontend speech_embedding needs {name} {value}, "
                        f"got {getattr(self, name)!r}"
                    )

    @property
    def window(self) -> int:
        """Samples the audio front end sees per frame (the frame and the `history` before it)."""
        return self.frame_window or self.frame_stride

    @property
    def history(self) -> int:
        """Samples of earlier frames an audio frame's window reaches back over (0: none)."""
        return self.window - self.frame_stride

    @property
    def feature_dim(self) -> int:
        """Features per frame into the frame projection: the window's samples (raw), n_mels
        (logmel, pcen), both compressions of the mel energies side by side (logmel_pcen), or the
        speech embedding's 96 (speech_embedding)."""
        if self.frontend == "raw":
            return self.window
        if self.frontend == "speech_embedding":
            return EMBED_DIM
        return 2 * self.n_mels if self.frontend == "logmel_pcen" else self.n_mels

    @property
    def has_pcen(self) -> bool:
        """Whether the audio front end has a PCEN stage, with its smoother's state (pcen.py)."""
        return self.encoder == "audio" and self.frontend in PCEN_FRONTENDS

    @property
    def n_classes(self) -> int:
        return len(self.labels)

    @property
    def out_dim(self) -> int:
        """Size of the last axis of the model's output (logits or class scores)."""
        return self.vocab_size if self.decoder == "lm" else self.n_classes

    def to_dict(self) -> dict[str, Any]:
        """Every field, except those added later that hold their off value (`_LATER`), so
        existing checkpoints' configs, and the snapshot hashes made from them, stay as they were."""
        data = asdict(self)
        for name, off in _LATER.items():
            if data[name] == off:
                del data[name]
        return data

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
    def preset(cls, name: str, **overrides: Any) -> DLRConfig:
        """The named preset (see `PRESETS`) with `overrides` applied."""
        if name not in PRESETS:
            raise ValueError(f"unknown DLRConfig preset {name!r}; known: {sorted(PRESETS)}")
        base = cls(**{k: (list(v) if isinstance(v, list) else v) for k, v in PRESETS[name].items()})
        return replace(base, **overrides)

    @classmethod
    def from_json(cls, text: str) -> DLRConfig:
        return cls.from_dict(json.loads(text))
