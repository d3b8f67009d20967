"""Shared fixtures for the trainer tests: a tiny text corpus and a tiny-model option set."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_MODEL = ["--d-model", "16", "--d-state", "8", "--n-layers", "2"]
QUIET = ["--no-progress", "--threads", "1", "--log-every", "1"]


# a few steps of a tiny LM on the `text_dir` corpus
TINY_LM = [
    *("--steps", "4", "--steps-per-epoch", "2", "--seq-len", "16", "--batch-size", "4"),
    *("--eval-tokens", "64", "--valid-fraction", "0.34", "--sample-bytes", "8", "--warmup", "1"),
    *TINY_MODEL,
    *QUIET,
]


def write_corpus(folder: Path) -> Path:
    """Three small documents (two for training, one held out) in `folder`."""
    folder.mkdir()
    line = "Now is the winter of our discontent made glorious summer by this sun of York.\n"
    for i in range(3):
        (folder / f"doc{i}.txt").write_text(f"DOC {i}\n" + line * (8 + i))
    return folder


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    """Three small documents (two for training, one held out)."""
    return write_corpus(tmp_path / "corpus")
