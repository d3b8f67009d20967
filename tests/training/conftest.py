"""Shared fixtures for the trainer tests: a tiny text corpus and a tiny-model option set."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_MODEL = ["--d-model", "16", "--d-state", "8", "--n-layers", "2"]
QUIET = ["--no-progress", "--threads", "1", "--log-every", "1"]


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    """Three small documents (two for training, one held out)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    line = "Now is the winter of our discontent made glorious summer by this sun of York.\n"
    for i in range(3):
        (folder / f"doc{i}.txt").write_text(f"DOC {i}\n" + line * (8 + i))
    return folder
