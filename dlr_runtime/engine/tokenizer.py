"""Byte-level tokenizer of the shipped language models, with incremental decoding for streams.

Token ids 0..255 are the UTF-8 bytes of the text; `bos` and `eos` are special ids above them
(checkpoint metadata: {"tokenizer": {"type": "bytes", "bos": 256, "eos": 257, "vocab_size": 258}}).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ByteTokenizer:
    bos: int = 256  # id fed once at the start of a session
    eos: int = 257  # id that ends a generation
    vocab_size: int = 258  # size of the LM's embedding table and logits

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any] | None, vocab_size: int) -> ByteTokenizer:
        """Tokenizer of a checkpoint; ValueError when its tokenizer is not a byte tokenizer."""
        spec = (metadata or {}).get("tokenizer")
        if spec is None:  # older checkpoints: the default byte layout
            if vocab_size != 258:
                raise ValueError(f"no tokenizer metadata and vocab_size {vocab_size} != 258")
            return cls()
        if not isinstance(spec, dict) or spec.get("type") != "bytes":
            raise ValueError(f"unsupported tokenizer {spec!r}; only type 'bytes' is served")
        tok = cls(bos=int(spec["bos"]), eos=int(spec["eos"]), vocab_size=int(spec["vocab_size"]))
        if tok.vocab_size != vocab_size:
            raise ValueError(
                f"tokenizer vocab_size {tok.vocab_size} differs from the model's {vocab_size}"
            )
        return tok

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder()


class IncrementalDecoder:
    """Turns a stream of token ids into text pieces; a split UTF-8 character waits for its end."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        if not 0 <= token < 256:
            return ""
        return self._dec.decode(bytes([token]))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
