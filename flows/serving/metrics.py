"""``GET /metrics``: the service's Prometheus metrics, in a registry of its own (one per service object)."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServeMetrics:
    """Requests, latency, batch sizes, queue depth and wait, errors, and the served index's version."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("dagrag_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.latency = Histogram("dagrag_request_seconds", "HTTP request latency", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("dagrag_batch_size", "questions per batched search", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.batch_seconds = Histogram("dagrag_batch_seconds", "seconds per batch (all its searches)",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("dagrag_queue_wait_seconds", "seconds a question waited for its batch",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.search_parts = Counter("dagrag_search_part_seconds", "seconds of batched search by the method's own "
                                    "parts (query encoding, walks, ...)", ["part"], registry=r)
        self.serialise = Counter("dagrag_serialise_seconds", "seconds spent turning results into response bodies",
                                 registry=r)
        self.queue_depth = Gauge("dagrag_queue_depth", "questions waiting for a batch", registry=r)
        self.errors = Counter("dagrag_errors", "refused or failed requests by kind", ["kind"], registry=r)
        self.index_version = Gauge("dagrag_index_version", "how many indexes this process has loaded (1 = the first)",
                                   registry=r)
        self.index_info = Gauge("dagrag_index_info", "the served index (1) by fingerprint",
                                ["method", "dataset", "fingerprint", "built_at"], registry=r)

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def batch(self, stats: Any) -> None:
        self.batch_size.observe(stats.size)
        self.batch_seconds.observe(stats.search_s)
        for wait in stats.queue_wait_s:
            self.queue_wait.observe(wait)

    def parts(self, parts: dict[str, float]) -> None:
        for name, seconds in parts.items():
            self.search_parts.labels(name).inc(seconds)

    def index_loaded(self, info: Any) -> None:
        self.index_version.inc()
        self.index_info.clear()
        self.index_info.labels(info.method, info.dataset, info.fingerprint, info.built_at).set(1)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
