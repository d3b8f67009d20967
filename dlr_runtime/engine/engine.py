"""The synchronous batched engine of one model: slots in a state pool, batched ops over slots.

Every operation takes a list of slot indices, gathers their state rows, calls the backend once
per group of rows that can share a call, and scatters the new rows back. There is no network
code and no threading here; the server's scheduler calls these methods from one worker thread.

- LM: `prefill(slots, token_lists)` feeds each slot its own tokens (any lengths) and returns the
  logits after the last one; `decode(slots, tokens)` feeds one token per slot.
- Speech: `feed_audio(slots, chunks)` feeds each slot its own samples (any lengths) and returns
  the class scores after every frame completed; `scores(slots)` the current scores.
- `snapshot(slot)` / `restore(slot, blob)`: one slot's state as checked bytes.

Batching never changes a session's segmentation: a prompt of length L is cut into the same
pieces (blocks of `prefill_block`, then the binary decomposition of the rest) whether it is fed
alone or with others, and rows are only grouped when their pieces have equal length. So a
session's results in a shared batch equal its results alone up to float rounding of batched
matmuls (tests check 1e-5 on float32).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from ..backends.base import Backend
from . import snapshot as snap
from .pool import StatePool
from .tokenizer import ByteTokenizer


def split_lengths(length: int, block: int) -> list[int]:
    """Piece lengths of a sequence: full blocks, then powers of two from large to small."""
    pieces = [block] * (length // block)
    rest = length % block
    bit = 1 << max(rest.bit_length() - 1, 0)
    while rest:
        if rest >= bit:
            pieces.append(bit)
            rest -= bit
        bit >>= 1
    return pieces


class Engine:
    """Batched inference for one model over a pool of `max_sessions` slots."""

    def __init__(
        self,
        backend: Backend,
        name: str,
        max_sessions: int,
        prefill_block: int = 256,
        metadata: dict | None = None,
        weights_hash: str = "",
    ) -> None:
        self.backend = backend
        self.name = name
        self.config = backend.config
        self.kind = "speech" if self.config.encoder == "audio" else "lm"
        self.pool = StatePool(backend, max_sessions)
        self.prefill_block = prefill_block
        self.metadata = dict(metadata or {})  # the checkpoint's metadata (labels, operating point)
        self.tokenizer: ByteTokenizer | None = None
        if self.kind == "lm":
            self.tokenizer = ByteTokenizer.from_metadata(metadata, self.config.vocab_size)
        self._fill = [0] * max_sessions  # host copy of each slot's samples pending in a frame
        # snapshots always hold the torch (RecurrentModel) layout, whatever the backend keeps in
        # its pool, so a session moves between replicas that picked different backends
        canon = self._to_canonical({k: v[:1] for k, v in self.pool.state.items()})
        # ties snapshots to this architecture, state layout and (when given) these weights
        self.config_hash = snap.config_hash(self.config, canon, weights_hash)
        self._row_like = {k: v[0] for k, v in canon.items()}
        # what a restored row may hold: derived from the torch form's parameters when there is
        # one (see snap.state_bounds), else what the config bounds and the generic caps
        rec = backend if hasattr(backend, "log_lam") else getattr(backend, "rec", None)
        self._bounds = (
            snap.state_bounds(rec) if rec is not None else snap.config_bounds(self.config)
        )

    # ------------------------------------------------------------------ sessions
    @property
    def device(self) -> torch.device:
        return self.pool.device

    def state_bytes_per_session(self) -> int:
        return self.backend.state_bytes()

    def open(self) -> int:
        """Allocate a slot with zero state (raises PoolFullError when full)."""
        slot = self.pool.alloc()
        self._fill[slot] = 0
        return slot

    def close(self, slot: int) -> None:
        """Zero and free a slot."""
        self.pool.free(slot)
        self._fill[slot] = 0

    def reset(self, slot: int) -> None:
        """Zero an allocated slot's state (a fresh stream in the same slot)."""
        self.pool.reset(slot)
        self._fill[slot] = 0

    # ------------------------------------------------------------------ language model
    def _need(self, kind: str) -> None:
        if self.kind != kind:
            raise TypeError(f"model {self.name!r} is a {self.kind} model, not a {kind} model")

    def prefill(self, slots: Sequence[int], tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """Feed each slot its token ids; return the logits after each slot's last token (B, V).

        Every token list must be non-empty.
        """
        self._need("lm")
        if len(slots) != len(tokens):
            raise ValueError("prefill needs one token list per slot")
        vocab = self.config.vocab_size
        for t in tokens:
            if len(t) == 0:
                raise ValueError("prefill needs at least one token per slot")
            if min(t) < 0 or max(t) >= vocab:
                raise ValueError(f"token ids must be in [0, {vocab})")
        plans = [split_lengths(len(t), self.prefill_block) for t in tokens]
        pos = [0] * len(slots)
        last: list[torch.Tensor | None] = [None] * len(slots)
        for r in range(max(len(p) for p in plans)):
            groups: dict[int, list[int]] = defaultdict(list)  # piece length -> row numbers
            for i, plan in enumerate(plans):
                if r < len(plan):
                    groups[plan[r]].append(i)
            for length, rows in groups.items():
                x = torch.tensor(
                    [list(tokens[i][pos[i] : pos[i] + length]) for i in rows], dtype=torch.int64
                ).to(self.device)  # (b, length)
                idx = self.pool.index([slots[i] for i in rows])
                y, new = self.backend.chunk(x, self.pool.gather(idx))  # y (b, length, V)
                self.pool.scatter(idx, new)
                for j, i in enumerate(rows):
                    pos[i] += length
                    last[i] = y[j, -1]
        return torch.stack(last)  # (B, V)

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """Feed one token per slot; return the logits after it (B, V)."""
        self._need("lm")
        if len(slots) != len(tokens):
            raise ValueError("decode needs one token per slot")
        if any(not 0 <= t < self.config.vocab_size for t in tokens):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        idx = self.pool.index(slots)
        x = torch.tensor(list(tokens), dtype=torch.int64, device=self.device)  # (B,)
        y, new = self.backend.step(x, self.pool.gather(idx))  # (B, V)
        self.pool.scatter(idx, new)
        return y

    # ------------------------------------------------------------------ speech
    def feed_audio(
        self, slots: Sequence[int], chunks: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Feed each slot its samples (at the model's rate); return per slot the class scores
        after every frame completed in its chunk, (F_i, C) with F_i >= 0.

        Rows with equal chunk length and equal position inside a frame share one backend call.
        """
        self._need("speech")
        if len(slots) != len(chunks):
            raise ValueError("feed_audio needs one chunk per slot")
        for s in slots:
            self.pool.check(s)
        stride = self.config.frame_stride
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, (s, c) in enumerate(zip(slots, chunks, strict=True)):
            groups[(int(c.numel()), self._fill[s])].append(i)
        out: list[torch.Tensor | None] = [None] * len(slots)
        n_cls = self.config.n_classes
        for (length, fill), rows in groups.items():
            if length == 0:
                for i in rows:
                    out[i] = torch.zeros(0, n_cls)
                continue
            x = torch.stack([chunks[i].reshape(-1) for i in rows]).to(self.device)  # (b, T)
            if not torch.isfinite(x).all():
                raise ValueError("audio samples must be finite")
            idx = self.pool.index([slots[i] for i in rows])
            y, new = self.backend.chunk(x, self.pool.gather(idx))  # (b, F, C)
            self.pool.scatter(idx, new)
            for j, i in enumerate(rows):
                out[i] = y[j]
                self._fill[slots[i]] = (fill + length) % stride
        return out  # type: ignore[return-value]

    def scores(self, slots: Sequence[int]) -> torch.Tensor:
        """Current class scores of each slot (B, C) (zero-input scores before any frame)."""
        self._need("speech")
        idx = self.pool.index(slots)
        return self.backend.scores(self.pool.gather(idx))

    def frames_done(self, slot: int) -> int:
        """Frames a speech slot has consumed (from its running-mean count)."""
        return int(self.pool.row(slot)["mean_count"].item())

    def pending_in_frame(self, slot: int) -> int:
        return self._fill[slot]

    # ------------------------------------------------------------------ snapshot / restore
    def snapshot(self, slot: int, extra: dict | None = None) -> bytes:
        """One slot's state (plus caller data `extra`, JSON-serialisable) as checked bytes."""
        row = self._to_canonical({k: v.unsqueeze(0) for k, v in self.pool.row(slot).items()})
        return snap.pack(self.name, self.config_hash, {k: v[0] for k, v in row.items()}, extra)

    def _to_canonical(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Backend state layout -> the canonical one (complex "ssm"); identity for torch."""
        return self.backend.to_canonical(state)

    def _to_native(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.backend.from_canonical(state)

    def restore(self, slot: int, blob: bytes) -> dict:
        """Load a snapshot into an allocated slot; returns its `extra`. Raises SnapshotError."""
        self.pool.check(slot)
        row, extra = snap.unpack(blob, self.name, self.config_hash, self._row_like)
        self._check_row(row)
        idx = self.pool.index([slot])
        native = self._to_native({k: v.unsqueeze(0).to(self.device) for k, v in row.items()})
        self.pool.scatter(idx, native)
        if "frame_fill" in row:
            self._fill[slot] = int(row["frame_fill"])
        return extra

    def _check_row(self, row: dict[str, torch.Tensor]) -> None:
        """A blob can be well-formed yet hold values no run produces; refuse those, since a
        bad row would fail every batch it joins."""
        snap.check_state(row, self._bounds)
        if "frame_fill" in row:
            fill = int(row["frame_fill"])
            if not 0 <= fill < self.config.frame_stride:
                raise snap.SnapshotError(f"state snapshot frame_fill {fill} is out of range")
