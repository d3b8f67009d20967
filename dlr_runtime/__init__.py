"""dlr_runtime: Diagonal Linear RNN models in convolution, chunk and step form.

Public API:
- `DLRConfig`, `DLRModel` (training / FFT-convolution mode)
- `to_recurrent`, `RecurrentModel` (streaming form: `init_state`, `step`, `chunk`)
- `save_checkpoint`, `load_checkpoint`, `load_recurrent`, `CheckpointError`
- `reference_forward` (plain float64 loop over time, the specification)
"""

from .checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_recurrent,
    read_header,
    save_checkpoint,
)
from .config import DLRConfig
from .model import DLRModel
from .recurrent import RecurrentModel, State, to_recurrent
from .reference import reference_forward
from .ssm import RecurrentParams

__all__ = [
    "CheckpointError",
    "DLRConfig",
    "DLRModel",
    "RecurrentModel",
    "RecurrentParams",
    "State",
    "load_checkpoint",
    "load_recurrent",
    "read_header",
    "reference_forward",
    "save_checkpoint",
    "to_recurrent",
]
