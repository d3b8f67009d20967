"""The batched inference engine: state pool, batched ops over slots, sampling, snapshots.

Public API:
- `Engine(backend, name, max_sessions, prefill_block=256, metadata=None)`: `open()`/`close(slot)`,
  `prefill(slots, token_lists)`, `decode(slots, tokens)`, `feed_audio(slots, chunks)`,
  `scores(slots)`, `snapshot(slot, extra)`, `restore(slot, blob)`.
- `StatePool`, `PoolFullError`, `SlotError`.
- `SamplingParams`, `sample_token`, `StopMatcher`; `ByteTokenizer`, `IncrementalDecoder`.
- `StreamResampler` (chunked resampling equal to one-shot resampling).
- `SnapshotError`, `SNAPSHOT_VERSION`.
"""

from .engine import Engine, split_lengths
from .pool import PoolFullError, SlotError, StatePool
from .resample import StreamResampler
from .sampling import SamplingParams, StopMatcher, sample_token
from .snapshot import SNAPSHOT_VERSION, SnapshotError
from .tokenizer import ByteTokenizer, IncrementalDecoder

__all__ = [
    "SNAPSHOT_VERSION",
    "ByteTokenizer",
    "Engine",
    "IncrementalDecoder",
    "PoolFullError",
    "SamplingParams",
    "SlotError",
    "SnapshotError",
    "StatePool",
    "StopMatcher",
    "StreamResampler",
    "sample_token",
    "split_lengths",
]
