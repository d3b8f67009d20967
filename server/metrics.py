"""Prometheus metrics of the server (all named `dlr_*`), in a registry owned by one app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
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
        self.detached = Gauge(
            "dlr_detached_sessions", "Sessions kept for resume without a connection", registry=r
        )
        self.persisted = Counter(
            "dlr_sessions_persisted_total",
            "Session states written or restored",
            ["event"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
