"""Architecture options shared by the recipes, mapped onto `dlr_runtime.DLRConfig`.

The command line speaks the paper's vocabulary (width H, state size N, layers, layer kind);
each recipe adds its task fields (encoder, decoder, vocabulary, labels, frame stride).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any

import tyro

from dlr_runtime import DLRConfig


@dataclass
class ModelOptions:
    d_model: Annotated[int, tyro.conf.arg(aliases=("--width",))] = 128  # width H
    # state size N (complex modes per feature)
    d_state: Annotated[int, tyro.conf.arg(aliases=("--state-size",))] = 64
    n_layers: Annotated[int, tyro.conf.arg(aliases=("--layers",))] = 4  # residual blocks
    layer: str = "dlr"  # dlr | s4d | lru
    shared_lambda: bool = True  # one lambda vector per layer shared by all features (paper)
    init: str = "omega"  # omega (roots of unity) | random
    dt_min: float = 1e-4  # smallest decay step of the init
    dt_max: float = 1e-1  # largest decay step of the init
    min_decay: float = 0.0  # dlr: decay floor per step, no mode outlives 1/min_decay steps
    norm: str = "layernorm"  # layernorm | rmsnorm | none
    prenorm: bool = True  # norm before each layer (else after the residual add)
    glu: bool = True  # GLU output projection
    dropout: float = 0.0  # dropout in every block

    def to_config(self, **task: Any) -> DLRConfig:
        """A validated DLRConfig with these options plus the task's fields."""
        return DLRConfig(**asdict(self), **task)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
