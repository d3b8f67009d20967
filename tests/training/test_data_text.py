"""Tests for the byte-level tokenizer, corpus loading/splitting and LM windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from training.data.text import (
    BOS,
    EOS,
    VOCAB_SIZE,
    ByteTokenizer,
    LMWindowDataset,
    TextConfig,
    default_corpus_files,
    encode_documents,
    load_corpus,
    random_batches,
    sequential_windows,
)


def test_constants() -> None:
    assert (BOS, EOS, VOCAB_SIZE) == (256, 257, 258)


@pytest.mark.parametrize("text", ["", "hello", "héllo wörld — 日本語 🎉\n\ttab", "\x00\xff"])
def test_tokenizer_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text, bos=True, eos=True)
    assert ids[0] == BOS and ids[-1] == EOS
    assert all(0 <= i < 256 for i in ids[1:-1])
    assert len(ids) == len(text.encode("utf-8")) + 2
    assert tok.decode(ids) == text


def test_tokenizer_invalid_utf8_and_specials() -> None:
    tok = ByteTokenizer()
    assert tok.decode([0xFF, ord("a"), EOS, BOS, 0xC3]) == "\ufffda\ufffd"
    assert tok.decode(torch.tensor([104, 105])) == "hi"


def _write_docs(root: Path, n: int = 10) -> list[Path]:
    paths = []
    for i in range(n):
        sub = root / ("a" if i % 2 else "b")
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / f"doc{i:02d}.txt"
        path.write_text(f"document {i}: " + "ünïcode " * (i + 5), encoding="utf-8")
        paths.append(path)
    (root / "ignored.bin").write_bytes(b"\x00\x01")
    return paths


def test_document_split_is_disjoint_and_deterministic(tmp_path: Path) -> None:
    files = _write_docs(tmp_path)
    cfg = TextConfig(paths=(str(tmp_path),), valid_fraction=0.2, seed=3)
    corpus = load_corpus(cfg)
    assert set(corpus.train_documents).isdisjoint(corpus.valid_documents)
    assert sorted(corpus.train_documents + corpus.valid_documents) == sorted(map(str, files))
    assert len(corpus.valid_documents) == 2
    n_docs = int((corpus.train == BOS).sum() + (corpus.valid == BOS).sum())
    assert n_docs == 10 and int((corpus.valid == EOS).sum()) == 2
    again = load_corpus(cfg)
    assert again.valid_documents == corpus.valid_documents
    np.testing.assert_array_equal(again.train, corpus.train)
    other = load_corpus(TextConfig(paths=(str(tmp_path),), valid_fraction=0.2, seed=4))
    assert other.valid_documents != corpus.valid_documents
    valid_text = ByteTokenizer().decode(corpus.valid.tolist())
    for doc in corpus.train_documents:
        assert Path(doc).read_text(encoding="utf-8") not in valid_text


def test_tail_split(tmp_path: Path) -> None:
    files = _write_docs(tmp_path, 4)
    cfg = TextConfig(paths=tuple(map(str, files)), valid_fraction=0.25, split_mode="tail")
    corpus = load_corpus(cfg)
    full = encode_documents(sorted(files))
    assert len(corpus.valid) == round(0.25 * len(full))
    np.testing.assert_array_equal(np.concatenate([corpus.train, corpus.valid]), full)


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_corpus(TextConfig(paths=(str(tmp_path / "nope"),)))


def test_default_corpus_available() -> None:
    files = default_corpus_files()
    assert files and all(f.is_file() for f in files)
    head = encode_documents(files[:1])
    assert head[0] == BOS and head[-1] == EOS and len(head) > 1000


def test_window_dataset() -> None:
    tokens = np.arange(1000, dtype=np.uint16) % VOCAB_SIZE
    ds = LMWindowDataset(tokens, seq_len=16, num_samples=50, seed=1)
    assert len(ds) == 50
    x, y = ds[7]
    assert x.shape == y.shape == (16,) and x.dtype == torch.int64
    np.testing.assert_array_equal(x[1:].numpy(), y[:-1].numpy())
    start = int(np.flatnonzero(tokens == int(x[0]))[0])
    np.testing.assert_array_equal(x.numpy(), tokens[start : start + 16])
    assert torch.equal(ds[7][0], LMWindowDataset(tokens, 16, 50, seed=1)[7][0])
    firsts = {int(ds[i][0][0]) for i in range(50)}
    ds.set_epoch(1)
    assert {int(ds[i][0][0]) for i in range(50)} != firsts
    with pytest.raises(IndexError):
        ds[50]
    with pytest.raises(ValueError):
        LMWindowDataset(tokens[:10], seq_len=16, num_samples=1)


def test_random_batches_and_sequential_windows() -> None:
    tokens = np.arange(200, dtype=np.uint16)
    it = random_batches(tokens, 8, 4, torch.Generator().manual_seed(0))
    x, y = next(it)
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1)
    x2, _ = next(random_batches(tokens, 8, 4, torch.Generator().manual_seed(0)))
    assert torch.equal(x, x2)
    windows = list(sequential_windows(tokens, 8))
    assert len(windows) == (200 - 1) // 8
    assert torch.equal(torch.cat([w[0] for w in windows]), torch.arange(len(windows) * 8))
