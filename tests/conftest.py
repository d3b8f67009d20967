"""Shared fixtures: tiny random models saved as checkpoints into a temporary models directory.

- `tiny-lm`: a byte-level LM (`DLRConfig.preset("tiny-lm")`, byte tokenizer metadata).
- `tiny-speech`: an audio classifier (`DLRConfig.preset("tiny-speech")`: 16 kHz, frame_stride
  160, SC10 labels).

Both are small enough that every test runs in seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# Small tensors: one intra-op thread is much faster than two threads that contend (and the
# server under test runs its own threads). Set once for the whole suite.
torch.set_num_threads(1)

from dlr_runtime import DLRConfig, DLRModel, save_checkpoint  # noqa: E402
from dlr_runtime.config import SC10_LABELS as LABELS  # noqa: E402,F401  (re-exported)

LM_NAME = "tiny-lm"
SPEECH_NAME = "tiny-speech"
TOKENIZER = {"type": "bytes", "bos": 256, "eos": 257, "vocab_size": 258}


def tiny_lm_config() -> DLRConfig:
    return DLRConfig.preset(LM_NAME)


def tiny_speech_config() -> DLRConfig:
    return DLRConfig.preset(SPEECH_NAME)


def write_models(root: Path) -> Path:
    """Write both tiny checkpoints under `root` (one directory per model)."""
    torch.manual_seed(0)
    lm = DLRModel(tiny_lm_config(), seed=1)
    with torch.no_grad():  # sharpen the LM so greedy choices are far from ties
        lm.head.proj.weight.mul_(4.0)
    save_checkpoint(lm, root / LM_NAME, tokenizer=TOKENIZER)
    save_checkpoint(DLRModel(tiny_speech_config(), seed=2), root / SPEECH_NAME)
    return root


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models directory holding `tiny-lm` and `tiny-speech`."""
    return write_models(tmp_path_factory.mktemp("models"))
