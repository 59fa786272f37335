"""The Prometheus metrics the workers export (one registry per process)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["FleetMetrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class FleetMetrics:
    """Counters and histograms of recording and preparing."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.events_recorded = Counter("ctx_events_recorded", "Events appended to the ledger", registry=r)
        self.events_duplicate = Counter(
            "ctx_events_duplicate", "Redelivered or re-published events recognised as already recorded", registry=r
        )
        self.events_rejected = Counter(
            "ctx_events_rejected", "Events dead-lettered, by error code", ["code"], registry=r
        )
        self.record_batch_seconds = Histogram(
            "ctx_record_batch_seconds", "Time to apply one fetched batch", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.record_batch_size = Histogram(
            "ctx_record_batch_size", "Messages per fetched batch", buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000), registry=r
        )
        self.record_retries = Counter(
            "ctx_record_retries", "Batches retried after a retryable failure, by error code", ["code"], registry=r
        )
        self.recorder_position = Gauge(
            "ctx_recorder_position", "Last stream sequence recorded, by partition", ["partition"], registry=r
        )
        self.prepare_seconds = Histogram(
            "ctx_prepare_seconds", "Prepare latency by purpose", ["purpose"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.prepare_errors = Counter("ctx_prepare_errors", "Prepares answered with an error, by code", ["code"], registry=r)
        self.prepare_tokens = Histogram(
            "ctx_prepare_tokens",
            "Tokens in a prepared context",
            ["purpose"],
            buckets=(500, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000),
            registry=r,
        )
        self.prepare_budget_ratio = Histogram(
            "ctx_prepare_budget_ratio",
            "Share of the input budget a prepared context uses",
            ["purpose"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0),
            registry=r,
        )
