"""Session state store (contract written below once complete)."""

from .base import (
    Entry,
    EntryInfo,
    Evicted,
    EvictReason,
    InvalidId,
    Latency,
    PutItem,
    PutResult,
    StateStore,
    StoreError,
    StoreLimits,
    StoreStats,
    StoreUnavailable,
    ValueTooLarge,
    check_id,
)
from .dirstore import DirStore
from .factory import open_store, parse_store_url
from .memory import MemoryStore

__all__ = [
    "DirStore",
    "Entry",
    "EntryInfo",
    "EvictReason",
    "Evicted",
    "InvalidId",
    "Latency",
    "MemoryStore",
    "PutItem",
    "PutResult",
    "StateStore",
    "StoreError",
    "StoreLimits",
    "StoreStats",
    "StoreUnavailable",
    "ValueTooLarge",
    "check_id",
    "open_store",
    "parse_store_url",
]
