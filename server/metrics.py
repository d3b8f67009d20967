"""Prometheus metrics of the server (all named `dlr_*`), in a registry owned by one app."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# prefix-cache stats (PrefixCacheStats.as_metrics names) exported per model
PREFIX_COUNTERS = (
    ("prefix_cache_lookups_total", "Prompt lookups in the prefix-state cache"),
    ("prefix_cache_hits_total", "Lookups that found a cached prefix"),
    ("prefix_cache_lookup_tokens_total", "Prompt tokens looked up"),
    ("prefix_cache_hit_tokens_total", "Prompt tokens served from cached states"),
    ("prefix_cache_inserts_total", "States inserted"),
    ("prefix_cache_evictions_total", "States evicted for the byte bound"),
)
PREFIX_GAUGES = (
    ("prefix_cache_bytes", "Bytes held by the prefix-state cache"),
    ("prefix_cache_max_bytes", "Byte bound of the prefix-state cache"),
    ("prefix_cache_entries", "States held"),
    ("prefix_cache_hit_rate", "Hits / lookups"),
    ("prefix_cache_token_hit_rate", "Hit tokens / looked-up tokens"),
)


class PrefixCacheCollector:
    """Reads every model's prefix-cache stats at scrape time (`source()` -> {model: stats
    dict}), so the cache keeps one set of counters."""

    def __init__(self, source: Callable[[], dict[str, dict[str, float]]]) -> None:
        self.source = source

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self.source()
        for name, doc in PREFIX_COUNTERS:
            fam = CounterMetricFamily(f"dlr_{name[: -len('_total')]}", doc, labels=["model"])
            for model, st in stats.items():
                fam.add_metric([model], st[name])
            yield fam
        for name, doc in PREFIX_GAUGES:
            fam = GaugeMetricFamily(f"dlr_{name}", doc, labels=["model"])
            for model, st in stats.items():
                fam.add_metric([model], st[name])
            yield fam


LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
PARK_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    1.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.active_sessions = Gauge(
            "dlr_active_sessions", "Open sessions", ["model", "kind"], registry=r
        )
        self.queue_depth = Gauge(
            "dlr_queue_depth", "Work items waiting for a batch", ["model"], registry=r
        )
        self.batch_size = Histogram(
            "dlr_batch_size",
            "Rows per batched call",
            ["model", "op"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_latency = Histogram(
            "dlr_batch_latency_seconds",
            "Time of one batched call",
            ["model", "op"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "dlr_time_to_first_token_seconds",
            "Request arrival to first token",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "dlr_inter_token_latency_seconds",
            "Time between tokens of a generation",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.generated_tokens = Counter(
            "dlr_generated_tokens_total", "Tokens generated", ["model"], registry=r
        )
        self.prompt_tokens = Counter(
            "dlr_prompt_tokens_total", "Tokens prefilled", ["model"], registry=r
        )
        self.audio_seconds = Counter(
            "dlr_audio_seconds_processed_total",
            "Audio processed (model rate)",
            ["model"],
            registry=r,
        )
        self.kws_frames = Counter(
            "dlr_kws_frames_total",
            "Frames of continuous streams by the voice-activity gate's decision",
            ["model", "decision"],  # computed | skipped
            registry=r,
        )
        self.kws_detections = Counter(
            "dlr_kws_detections_total", "Commands detected in continuous streams", ["model"],
            registry=r,
        )  # fmt: skip
        self.rtf = Histogram(
            "dlr_real_time_factor",
            "Compute time / audio duration of a speech batch",
            ["model"],
            buckets=(0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
            registry=r,
        )
        self.evictions = Counter(
            "dlr_evictions_total",
            "Sessions closed by the server",
            ["model", "reason"],
            registry=r,
        )
        self.slots_in_use = Gauge(
            "dlr_pool_slots_in_use", "State-pool slots in use", ["model"], registry=r
        )
        self.rejections = Counter(
            "dlr_rejections_total", "Requests or sessions refused", ["reason"], registry=r
        )
        self.batch_failures = Counter(
            "dlr_batch_failures_total", "Batches that raised", ["model"], registry=r
        )

        self.speech_lag = Histogram(
            "dlr_speech_lag_seconds",
            "Audio received but not yet processed, per speech session, after each batch",
            ["model"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.resumes = Counter(
            "dlr_session_resumes_total", "Sessions resumed", ["kind", "how"], registry=r
        )
        self.websockets = Gauge(
            "dlr_open_websockets",
            "WebSocket connections whose handler has not returned yet (any endpoint)",
            registry=r,
        )
        self.detached = Gauge(
            "dlr_detached_sessions", "Sessions kept for resume without a connection", registry=r
        )
        self.persisted = Counter(
            "dlr_sessions_persisted_total",
            "Session states written, lost (not written on drain), restored or failed to restore",
            ["event"],
            registry=r,
        )

        # ---- durable sessions (server/durable.py)
        self.parked_sessions = Gauge(
            "dlr_parked_sessions",
            "Sessions parked (no slot; state in RAM or the store)",
            registry=r,
        )
        self.checkpoints = Counter(
            "dlr_checkpoints_total", "Session checkpoints", ["event"], registry=r
        )
        self.checkpoint_backlog = Gauge(
            "dlr_checkpoint_backlog", "Checkpoints not yet confirmed by the store", registry=r
        )
        self.store_degraded = Gauge(
            "dlr_state_store_degraded", "1 while the state store is failing", registry=r
        )
        self.store_entries = Gauge("dlr_state_store_sessions", "Sessions stored", registry=r)
        self.store_bytes = Gauge("dlr_state_store_bytes", "Bytes stored", registry=r)
        self.parked_ram_bytes = Gauge(
            "dlr_parked_ram_bytes", "Parked snapshots held in RAM", registry=r
        )
        self.store_write_p99 = Gauge(
            "dlr_state_store_write_p99_seconds", "Recent store write latency, p99", registry=r
        )
        self.store_read_p99 = Gauge(
            "dlr_state_store_read_p99_seconds", "Recent store read latency, p99", registry=r
        )
        self.store_failures_total = Gauge(
            "dlr_state_store_failed_calls", "Failed state-store calls so far", registry=r
        )
        self.store_failures = Counter(
            "dlr_state_store_failures_total", "State reads that failed", ["op"], registry=r
        )
        self.store_evictions = Counter(
            "dlr_state_store_evictions_total", "Stored sessions evicted", ["reason"], registry=r
        )
        self.park_seconds = Histogram(
            "dlr_park_seconds",
            "Time to park a session, read its state back (restore), or bring it back into "
            "a slot (unpark: read + verify + engine restore)",
            ["op"],
            buckets=PARK_BUCKETS,
            registry=r,
        )

    def watch_prefix_caches(self, source: Callable[[], dict[str, dict[str, float]]]) -> None:
        self.registry.register(PrefixCacheCollector(source))

    def render(self) -> bytes:
        return generate_latest(self.registry)
