"""Prefix-state cache: a radix tree over token ids whose nodes hold exact recurrent states.

A DLR model's state after a prefix is exact at every token and of fixed size (a few hundred
kilobytes for the shipped byte LM), so a prompt that extends any cached prefix only needs the
rest prefilled. `PrefixCache` keeps such states for ONE model (one cache per engine; states of
other weights or another state layout must never be looked up in it; `clear()` on a reload):

- `insert(tokens, state, logits=None, pin=False)` stores a *copy* of `state` (one slot's state
  in the engine's canonical layout: name -> tensor without the batch axis) and, when given, the
  logits after the last token (V,), so a prompt equal to a cached prefix needs no prefill at all.
- `lookup(tokens, max_len=None) -> PrefixHit`: the LONGEST cached prefix of `tokens` (at any
  token, not at block boundaries), with copies of its state and logits; a miss has length 0.
- `shared_length(tokens)`: how far `tokens` follows any stored key, i.e. where it branches off
  earlier prompts; inserting a state there lets the next sibling prompt hit without any
  boundary being declared.
- Pinned entries (`pin=True`, e.g. from `POST /v1/prefixes`) are never evicted; `unpin` and
  `remove` undo them.

Memory is bounded by `max_bytes`: the bytes of every stored tensor plus 8 bytes per token on the
tree's edges (one tuple slot; byte-level token ids are interned small ints; for long prompts the
keys cost about as much as a state). Eviction is LRU over unpinned entries (least recently
inserted or hit goes first). Every entry of one model holds the same state bytes, so a
cost-aware score ("prefill saved per byte held", as in Marconi) reduces to the tokens an entry
saves beyond its nearest cached ancestor; that refinement is not implemented: recency already
tracks which conversations are live, and an evicted entry's ancestors (message boundaries) still
serve most of its prefix. An insert that cannot fit even after evicting every unpinned entry is
dropped (counted in `stats().rejected`); pinning beyond the bound raises `PrefixCacheFull`.

Thread-safety: every public method takes one internal lock, so the engine thread may insert and
look up while another thread (metrics, an admin route) reads `stats()` or pins. States are
cloned on insert and on lookup, so nothing in the cache aliases a live slot.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

State = dict[str, torch.Tensor]
KEY_BYTES_PER_TOKEN = 8  # accounted cost of one token id on a tree edge


class PrefixCacheFull(RuntimeError):
    """A pinned entry does not fit in the cache's byte bound."""


@dataclass
class PrefixHit:
    """Result of a lookup: the longest cached prefix of the query (length 0 = miss)."""

    length: int  # tokens of the query covered by the cached state
    state: State | None  # copy of the state after those tokens (None on a miss)
    logits: torch.Tensor | None  # copy of the logits after the last of them (V,), if stored


@dataclass
class PrefixCacheStats:
    """Counters for metrics (monotonic ones since creation, the rest current)."""

    lookups: int  # lookups made
    hits: int  # lookups that found a prefix of length > 0
    lookup_tokens: int  # tokens queried in all lookups
    hit_tokens: int  # tokens covered by the prefixes found
    inserts: int  # entries stored (a re-insert of an existing prefix only refreshes it)
    evictions: int  # entries evicted for space
    rejected: int  # inserts dropped because they could not fit
    entries: int  # entries held now
    pinned: int  # pinned entries held now
    bytes: int  # accounted bytes held now
    max_bytes: int  # the bound

    @property
    def hit_rate(self) -> float:
        """Fraction of lookups that found a prefix."""
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def token_hit_rate(self) -> float:
        """Fraction of queried prompt tokens whose prefill the cache saved."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def as_metrics(self) -> dict[str, float]:
        """Prometheus-style names -> values (counters end in _total)."""
        return {
            "prefix_cache_lookups_total": self.lookups,
            "prefix_cache_hits_total": self.hits,
            "prefix_cache_lookup_tokens_total": self.lookup_tokens,
            "prefix_cache_hit_tokens_total": self.hit_tokens,
            "prefix_cache_inserts_total": self.inserts,
            "prefix_cache_evictions_total": self.evictions,
            "prefix_cache_rejected_total": self.rejected,
            "prefix_cache_entries": self.entries,
            "prefix_cache_pinned_entries": self.pinned,
            "prefix_cache_bytes": self.bytes,
            "prefix_cache_max_bytes": self.max_bytes,
            "prefix_cache_hit_rate": self.hit_rate,
            "prefix_cache_token_hit_rate": self.token_hit_rate,
        }


@dataclass(eq=False)
class _Node:
    edge: tuple[int, ...]  # token ids from the parent to this node
    parent: _Node | None
    depth: int  # tokens from the root to the end of `edge`
    children: dict[int, _Node] = field(default_factory=dict)  # first edge token -> child
    state: State | None = None
    logits: torch.Tensor | None = None
    nbytes: int = 0  # bytes of state + logits
    pinned: bool = False


def _nbytes(state: State, logits: torch.Tensor | None) -> int:
    n = sum(t.element_size() * t.numel() for t in state.values())
    return n + (logits.element_size() * logits.numel() if logits is not None else 0)


def _copy(state: State, device: torch.device | None) -> State:
    return {k: v.detach().to(device or v.device, copy=True) for k, v in state.items()}


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def max_bytes_from_env(default_mb: float = 256.0) -> int:
    """The byte bound from `DLR_PREFIX_CACHE_MB` (MiB; 0 disables the cache)."""
    raw = os.environ.get("DLR_PREFIX_CACHE_MB", "")
    mb = float(raw) if raw.strip() else default_mb
    if not mb >= 0:
        raise ValueError(f"DLR_PREFIX_CACHE_MB must be a number >= 0, got {raw!r}")
    return int(mb * 1024 * 1024)


class PrefixCache:
    """Radix tree of exact states keyed by token-id prefixes, bounded to `max_bytes`.

    `device`: where stored copies live (None = the device of the tensors given to `insert`);
    a CPU cache beside a GPU engine trades a copy per hit for GPU memory.
    """

    def __init__(self, max_bytes: int, device: torch.device | str | None = None) -> None:
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.device = torch.device(device) if device is not None else None
        self._root = _Node(edge=(), parent=None, depth=0)
        self._lru: OrderedDict[_Node, None] = OrderedDict()  # unpinned entries, oldest first
        self._lock = threading.Lock()
        self._bytes = 0
        self._entries = 0
        self._pinned = 0
        self._c = dict.fromkeys(
            ("lookups", "hits", "lookup_tokens", "hit_tokens", "inserts", "evictions", "rejected"),
            0,
        )

    # ------------------------------------------------------------------ queries
    def lookup(self, tokens: Sequence[int], max_len: int | None = None) -> PrefixHit:
        """The longest cached prefix of `tokens` of at most `max_len` tokens, copied out."""
        tokens = tuple(tokens)
        limit = len(tokens) if max_len is None else min(max_len, len(tokens))
        with self._lock:
            best = self._deepest_entry(tokens, limit)
            self._c["lookups"] += 1
            self._c["lookup_tokens"] += len(tokens)
            if best is None:
                return PrefixHit(0, None, None)
            self._c["hits"] += 1
            self._c["hit_tokens"] += best.depth
            if not best.pinned:
                self._lru.move_to_end(best)
            state = _copy(best.state, None)  # type: ignore[arg-type]
            logits = best.logits.clone() if best.logits is not None else None
            return PrefixHit(best.depth, state, logits)

    def shared_length(self, tokens: Sequence[int]) -> int:
        """Length of the longest common prefix of `tokens` with any key on the tree (cached
        or not): where a new prompt branches off earlier ones (no stats, no LRU refresh)."""
        tokens = tuple(tokens)
        with self._lock:
            node, pos = self._root, 0
            while pos < len(tokens):
                child = node.children.get(tokens[pos])
                if child is None:
                    break
                n = _common(child.edge, tokens[pos : pos + len(child.edge)])
                pos += n
                if n < len(child.edge):
                    break
                node = child
            return pos

    def contains(self, tokens: Sequence[int]) -> bool:
        """Whether exactly this prefix holds an entry (no stats, no LRU refresh)."""
        with self._lock:
            node = self._find(tuple(tokens))
            return node is not None and node.state is not None

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return PrefixCacheStats(
                **self._c,
                entries=self._entries,
                pinned=self._pinned,
                bytes=self._bytes,
                max_bytes=self.max_bytes,
            )

    def __len__(self) -> int:
        return self._entries

    # ------------------------------------------------------------------ updates
    def insert(
        self,
        tokens: Sequence[int],
        state: State,
        logits: torch.Tensor | None = None,
        pin: bool = False,
    ) -> bool:
        """Store a copy of the state after `tokens` (and the logits after the last one).

        Returns whether the prefix is held afterwards. Re-inserting a held prefix refreshes its
        recency (and pins it when `pin`), keeping the stored tensors. Raises PrefixCacheFull
        when a pinned entry cannot fit beside the other pinned entries.
        """
        tokens = tuple(tokens)
        if not tokens:
            raise ValueError("a cached prefix needs at least one token")
        with self._lock:
            node = self._find(tokens)
            if node is not None and node.state is not None:
                if pin and not node.pinned:
                    self._lru.pop(node, None)
                    node.pinned = True
                    self._pinned += 1
                elif not node.pinned:
                    self._lru.move_to_end(node)
                return True
            need = _nbytes(state, logits) + self._new_key_bytes(tokens)
            if pin and self._pinned_bytes() + need > self.max_bytes:
                raise PrefixCacheFull(
                    f"a pinned prefix of {need} bytes does not fit in the cache "
                    f"({self.max_bytes} bytes, {self._pinned_bytes()} of them pinned)"
                )
            if need > self.max_bytes:
                self._c["rejected"] += 1
                return False
            self._make_room(need)
            node = self._add_path(tokens)
            node.state = _copy(state, self.device)
            node.logits = None
            if logits is not None:
                node.logits = logits.detach().to(self.device or logits.device, copy=True)
            node.nbytes = _nbytes(node.state, node.logits)
            node.pinned = pin
            self._bytes += node.nbytes
            self._entries += 1
            if pin:
                self._pinned += 1
            else:
                self._lru[node] = None
            self._make_room(0)  # evictions above may have un-shared edges of the new path
            if node.state is None:
                self._c["rejected"] += 1
                return False
            self._c["inserts"] += 1
            return True

    def unpin(self, tokens: Sequence[int]) -> bool:
        """Make a pinned entry evictable again; returns whether it was pinned."""
        with self._lock:
            node = self._find(tuple(tokens))
            if node is None or node.state is None or not node.pinned:
                return False
            node.pinned = False
            self._pinned -= 1
            self._lru[node] = None
            self._make_room(0)
            return True

    def remove(self, tokens: Sequence[int]) -> bool:
        """Drop the entry of exactly this prefix (pinned or not); returns whether it existed."""
        with self._lock:
            node = self._find(tuple(tokens))
            if node is None or node.state is None:
                return False
            self._drop(node)
            return True

    def clear(self) -> None:
        """Drop every entry, pinned ones included (counters are kept)."""
        with self._lock:
            self._root = _Node(edge=(), parent=None, depth=0)
            self._lru.clear()
            self._bytes = self._entries = self._pinned = 0

    # ------------------------------------------------------------------ tree internals
    def _deepest_entry(self, tokens: tuple[int, ...], limit: int) -> _Node | None:
        node, pos, best = self._root, 0, None
        while pos < limit:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            end = pos + len(child.edge)
            if end > limit or tokens[pos:end] != child.edge:
                break
            node, pos = child, end
            if node.state is not None:
                best = node
        return best

    def _find(self, tokens: tuple[int, ...]) -> _Node | None:
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                return None
            end = pos + len(child.edge)
            if tokens[pos:end] != child.edge:
                return None
            node, pos = child, end
        return node if pos == len(tokens) else None

    def _new_key_bytes(self, tokens: tuple[int, ...]) -> int:
        """Edge bytes that adding `tokens` would add (the part not yet on the tree)."""
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common(child.edge, tokens[pos:])
            pos += n
            if n < len(child.edge):
                break
            node = child
        return (len(tokens) - pos) * KEY_BYTES_PER_TOKEN

    def _add_path(self, tokens: tuple[int, ...]) -> _Node:
        """The node ending exactly at `tokens`, splitting an edge or adding a leaf as needed."""
        node, pos = self._root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = _Node(edge=tokens[pos:], parent=node, depth=len(tokens))
                node.children[tokens[pos]] = leaf
                self._bytes += len(leaf.edge) * KEY_BYTES_PER_TOKEN
                return leaf
            n = _common(child.edge, tokens[pos:])
            if n < len(child.edge):  # split child's edge at n: node -> mid -> child
                mid = _Node(edge=child.edge[:n], parent=node, depth=pos + n)
                node.children[tokens[pos]] = mid
                child.edge = child.edge[n:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                child = mid
            node, pos = child, pos + n
        return node

    def _drop(self, node: _Node) -> None:
        """Remove node's entry, then prune nodes that no longer carry anything."""
        self._bytes -= node.nbytes
        self._entries -= 1
        if node.pinned:
            self._pinned -= 1
        self._lru.pop(node, None)
        node.state, node.logits, node.nbytes, node.pinned = None, None, 0, False
        while node.parent is not None and node.state is None and len(node.children) <= 1:
            parent = node.parent
            if node.children:  # merge the only child into this node's edge
                (child,) = node.children.values()
                child.edge = node.edge + child.edge
                child.parent = parent
                parent.children[node.edge[0]] = child
            else:
                del parent.children[node.edge[0]]
                self._bytes -= len(node.edge) * KEY_BYTES_PER_TOKEN
            node = parent

    def _pinned_bytes(self) -> int:
        """Bytes that would stay held if every unpinned entry were evicted (a tree walk)."""

        def walk(node: _Node) -> tuple[int, bool]:
            total, keep = (node.nbytes, True) if node.pinned else (0, False)
            for child in node.children.values():
                sub, sub_keep = walk(child)
                if sub_keep:
                    total += sub + len(child.edge) * KEY_BYTES_PER_TOKEN
                    keep = True
            return total, keep

        return walk(self._root)[0]

    def _make_room(self, need: int) -> bool:
        """Evict LRU entries until `need` more bytes fit; False if they cannot."""
        while self._bytes + need > self.max_bytes and self._lru:
            oldest = next(iter(self._lru))
            self._drop(oldest)
            self._c["evictions"] += 1
        return self._bytes + need <= self.max_bytes
