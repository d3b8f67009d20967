"""One state layout for every backend: `state_spec(config, cdtype)` and what derives from it.

A session's recurrent state is a dict of batch-first tensors of fixed shape:

    "ssm"         (L, H, N)   complex `cdtype`     the diagonal state of every layer
    "frame_buf"   (S,)        real of `cdtype`     audio: samples of the frame being filled
    "frame_fill"  ()          int64                audio: how many of them are filled
    "frame_hist"  (P,)        real of `cdtype`     audio, overlapping windows (P = history > 0):
                                                   the samples before the frame being filled
    "embed_cache" (K,)        real of `cdtype`     audio, speech-embedding front end instead of
                                                   "frame_hist": its convolutions' last rows
                                                   (speech_embedding_stream.py)
    "feat_sum"    (F,)        float64              audio, feature normalisation on: decayed
                                                   sum of front-end features (feature_norm.py)
    "feat_count"  ()          float64              its decayed count of frames
    "pcen_sum"    (M,)        float64              audio, PCEN front ends: decayed sum of mel
                                                   energies (pcen.py)
    "pcen_count"  ()          float64              its decayed count of frames
    "mean_sum"    (H,)        float64              classifier: running sum of head features
    "mean_count"  ()          float64              classifier: positions summed

`state_spec` gives (shape without the batch axis, dtype) per name; backends build their state
with `init_state(spec, batch, device)` and size it with `state_bytes(spec)`. A backend that
keeps the complex state as two real tensors (ONNX Runtime) uses `split_complex(spec)`, which
replaces "ssm" by "ssm_re" and "ssm_im". This canonical layout is the one snapshots carry.
"""

from __future__ import annotations

import torch

from .config import DLRConfig
from .speech_embedding_stream import cache_size

State = dict[str, torch.Tensor]
Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]
REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}
COMPLEX_OF = {v: k for k, v in REAL_OF.items()}


def state_spec(config: DLRConfig, cdtype: torch.dtype = torch.complex64) -> Spec:
    """name -> (per-session shape, dtype) of the canonical state of a `config` network."""
    if cdtype not in REAL_OF:
        raise ValueError(f"state dtype must be complex64 or complex128, got {cdtype}")
    spec: Spec = {"ssm": ((config.n_layers, config.d_model, config.d_state), cdtype)}
    if config.encoder == "audio":
        spec["frame_buf"] = ((config.frame_stride,), REAL_OF[cdtype])
        spec["frame_fill"] = ((), torch.int64)
        if config.frontend == "speech_embedding":
            spec["embed_cache"] = ((cache_size(),), REAL_OF[cdtype])
        elif config.history:
            spec["frame_hist"] = ((config.history,), REAL_OF[cdtype])
        if config.has_pcen:
            spec["pcen_sum"] = ((config.n_mels,), torch.float64)
            spec["pcen_count"] = ((), torch.float64)
        if config.feature_norm_s:
            spec["feat_sum"] = ((config.feature_dim,), torch.float64)
            spec["feat_count"] = ((), torch.float64)
    if config.decoder == "classifier":
        spec["mean_sum"] = ((config.d_model,), torch.float64)
        spec["mean_count"] = ((), torch.float64)
    return spec


def split_complex(spec: Spec) -> Spec:
    """The same layout with the complex "ssm" carried as real "ssm_re" and "ssm_im"."""
    out: Spec = {}
    for name, (shape, dtype) in spec.items():
        if name == "ssm":
            out["ssm_re"] = out["ssm_im"] = (shape, REAL_OF[dtype])
        else:
            out[name] = (shape, dtype)
    return out


def init_state(spec: Spec, batch: int, device: torch.device | str = "cpu") -> State:
    """Zero state for `batch` sessions, every tensor (batch, *shape)."""
    return {
        k: torch.zeros(batch, *shape, dtype=dt, device=device) for k, (shape, dt) in spec.items()
    }


def state_bytes(spec: Spec) -> int:
    """Bytes of one session's state."""
    total = 0
    for shape, dtype in spec.values():
        numel = 1
        for s in shape:
            numel *= s
        total += numel * torch.empty((), dtype=dtype).element_size()
    return total
