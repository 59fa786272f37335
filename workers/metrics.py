"""The Prometheus metrics the workers export (one registry per process).

Names follow Prometheus's conventions, and ``tests/unit/test_metric_names.py`` holds every metric to
them: the unit comes last and is one per metric (``_seconds``, ``_bytes``, ``_tokens``, ``_ratio``,
or what a count counts: ``_events``, ``_jobs``, ``_threads``, ``_requests``...), counters end in
``_total``, and label values are bounded (a policy is labelled by its name, never its revision).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.app.final_checks import GatewayService
from services.app.step_timing import PREPARE_STAGES, RECORD_STAGES, PrepareStages, RecordStages
from services.app.view_cache import ViewCache

__all__ = ["FleetMetrics", "GcPauses", "policy_label"]

# No ``*_created`` series: one more series per counter and histogram child, for a start time that
# Prometheus's own reset handling makes redundant. Process-wide, as prometheus-client's switch is.
disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus-client

_TOKEN_BUCKETS = (500, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 1_000_000)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A stage of a batch or a prepare takes from a tenth of a millisecond (back to back) to seconds (a wait).
_STAGE_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
_GC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def policy_label(policy: str) -> str:
    """The ``policy`` label of a ``name@revision`` reference: its name. Every registration makes a new
    revision, so a label carrying it would grow a series per registration; names are as few as the
    policies an operator registers."""
    return policy.partition("@")[0]


class GcPauses:
    """Times every collection of the process's cyclic garbage collector into a histogram.

    A collection stops the event loop: a full one walks every tracked object the caches hold, so it
    is the hot path's tail and operators need to see it, by generation.
    """

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        self._started = 0.0
        self.longest_s = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.longest_s = max(self.longest_s, pause)
        self._histogram.labels(generation=str(info.get("generation", ""))).observe(pause)

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


@dataclass(frozen=True)
class _ScrapeCollector(Collector):
    """Counts a service keeps itself (in services/app), read at scrape time."""

    read: Callable[[], Iterator[Metric]]

    def collect(self) -> Iterator[Metric]:
        return self.read()


def _view_cache_metrics(c: ViewCache) -> Iterator[Metric]:
    yield CounterMetricFamily("ctx_view_cache_hits_total", "View cache lookups that found an entry", c.hits)
    yield CounterMetricFamily("ctx_view_cache_misses_total", "View cache lookups that found none", c.misses)
    yield CounterMetricFamily(
        "ctx_view_cache_evictions_total", "View cache entries evicted to stay under the bound", c.evictions
    )
    yield GaugeMetricFamily("ctx_view_cache_bytes", "Estimated bytes the view cache holds", c.bytes)
    yield GaugeMetricFamily(
        "ctx_view_cache_max_bytes", "The view cache's bound (CTX_VIEW_CACHE_MB)", c.max_bytes
    )
    yield GaugeMetricFamily("ctx_view_cache_entries", "Entries in the view cache", len(c))


def _gateway_metrics(g: GatewayService) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "ctx_gateway_pending_records",
        "Records of answered prepared contexts not stored yet (through a store outage)",
        g.pending_records,
    )
    yield GaugeMetricFamily(
        "ctx_gateway_pending_bytes", "Estimated bytes of the pending gateway records", g.pending_bytes
    )
    yield CounterMetricFamily(
        "ctx_gateway_records_stored_total", "Gateway records stored by the write-behind", g.stored_records
    )
    yield CounterMetricFamily(
        "ctx_gateway_record_retries_total",
        "Gateway records whose store was retried because the store was unavailable",
        g.retried_records,
    )
    dropped = CounterMetricFamily(
        "ctx_gateway_records_dropped_total",
        "Gateway records never stored, by reason: rejected by the store, underivable, "
        "or still pending at shutdown",
        labels=["reason"],
    )
    for reason in ("rejected", "underivable", "shutdown"):
        dropped.add_metric([reason], g.dropped_records[reason])
    yield dropped
    yield CounterMetricFamily(
        "ctx_gateway_prepares_refused_total",
        "Prepares answered overloaded because the pending gateway records were at their bound",
        g.refused_prepares,
    )


@dataclass
class FleetMetrics:
    """Counters and histograms of recording and preparing."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _watched: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        counter = partial(Counter, registry=self.registry)
        gauge = partial(Gauge, registry=self.registry)
        histogram = partial(Histogram, registry=self.registry)
        latency = partial(histogram, buckets=_LATENCY_BUCKETS)
        tokens = partial(histogram, buckets=_TOKEN_BUCKETS)
        stages = partial(histogram, buckets=_STAGE_BUCKETS)
        self.events_recorded = counter("ctx_events_recorded_total", "Events appended to the ledger")
        self.hook_calls = counter(
            "ctx_hook_calls_total",
            "Context hook calls, by point and outcome (ok, patched, rejected, refused, timeout, error)",
            ["point", "outcome"],
        )
        self.hook_seconds = latency("ctx_hook_seconds", "Context hook call latency, by point", ["point"])
        self.gc_pauses = GcPauses(
            histogram(
                "ctx_gc_pause_seconds",
                "Pauses of the garbage collector in this process, by generation (2: a full collection)",
                ["generation"],
                buckets=_GC_BUCKETS,
            )
        )
        self.events_duplicate = counter(
            "ctx_events_duplicate_total", "Redelivered or re-published events recognised as already recorded"
        )
        self.events_rejected = counter(
            "ctx_events_rejected_total", "Events dead-lettered, by error code", ["code"]
        )
        self.events_unstorable = counter(
            "ctx_recorder_events_unstorable_total",
            "Events that passed every check yet failed alone every attempt to record them, dead-lettered "
            "unstorable_event so their partition moves on, by the step that failed (a bug or a value the "
            "recorder did not foresee: see the recorder's log for the traceback)",
            ["stage"],
        )
        self.record_batch_seconds = latency("ctx_record_batch_seconds", "Time to apply one fetched batch")
        self.record_stage_seconds = stages(
            "ctx_record_stage_seconds",
            "Time of each stage of a batch's attempt: read (the ledger's state its plan needs), plan, "
            "write (dead letters and the commit)",
            ["stage"],
        )
        self.record_batch_events = histogram(
            "ctx_record_batch_events",
            "Events per fetched batch",
            buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000),
        )
        self.record_retries = counter(
            "ctx_record_retries_total", "Batches retried after a retryable failure, by error code", ["code"]
        )
        self.recorder_position = gauge(
            "ctx_recorder_position", "Last stream sequence recorded, by partition", ["partition"]
        )
        self.stream_truncations = counter(
            "ctx_recorder_stream_truncations_total",
            "Times the events stream came back shorter than the committed positions "
            "(a broker killed before it flushed what it acked) "
            "and the positions past its end were lowered to it",
        )
        self.recorder_halted = gauge(
            "ctx_recorder_halted",
            "1 while the recorder records nothing because the events stream went backwards or was "
            "re-created (see /readyz)",
        )
        self.prepare_seconds = latency(
            "ctx_prepare_seconds", "Prepare latency by purpose", ["purpose", "policy"]
        )
        self.prepare_stage_seconds = stages(
            "ctx_prepare_stage_seconds",
            "Time of each stage of a prepare: wait (for the event it names), load (its view from the "
            "ledger), assemble, reply (serialized)",
            ["stage"],
        )
        self.prepare_input_tokens = tokens(
            "ctx_prepare_input_tokens",
            "Input tokens of a prepared context as held against its budget, by how they were counted: "
            "local (counted here) or provider_usage+local (the provider's usage of the last response "
            "plus what came after it)",
            ["purpose", "policy", "calibration"],
        )
        self.prepare_budget_tokens = tokens(
            "ctx_prepare_budget_tokens", "Input budget per prepare", ["purpose", "policy"]
        )
        self.prepare_reductions = counter(
            "ctx_prepare_reductions_total",
            "Deterministic reductions applied on the hot path, by kind",
            ["kind"],
        )
        self.window_level_prepares = counter(
            "ctx_window_level_prepares_total",
            "Prepared contexts by the water level of their window",
            ["level"],
        )
        self.window_level_seconds = counter(
            "ctx_window_level_seconds_total",
            "Seconds threads' windows stood at each water level, between one prepare and the next",
            ["level"],
        )
        self.prepare_compaction_waits = counter(
            "ctx_prepare_compaction_waits_total", "Prepares that waited for a compaction to land", ["outcome"]
        )
        self.prepare_compaction_wait_seconds = latency(
            "ctx_prepare_compaction_wait_seconds", "Time prepares waited for a compaction"
        )
        # Window rollovers: why each window closed, how large its handoff was, and how
        # long the prepare spent closing it before assembling the next window.
        self.window_rollovers = counter(
            "ctx_window_rollovers_total", "Windows closed by a rollover, by trigger", ["trigger"]
        )
        self.window_handoff_tokens = tokens(
            "ctx_window_handoff_tokens", "Tokens of the handoff a rollover committed (o200k)"
        )
        self.window_rollover_seconds = latency(
            "ctx_window_rollover_seconds", "Time a prepare spent deciding, building and committing a rollover"
        )
        self.budget_overflows = counter(
            "ctx_budget_overflows_total", "Prepares refused as over budget, by reason", ["reason"]
        )
        # Explicit context-length refusals a runtime reported: recovered (recalibrated, compaction forced,
        # a smaller context answered) or refused as the second on the same view.
        self.provider_overflows = counter(
            "ctx_provider_overflows_total",
            "Provider context-length overflows reported by runtimes, by profile and outcome",
            ["profile", "outcome"],
        )
        self.trigger_hits = counter(
            "ctx_compaction_trigger_hits_total",
            "Policy triggers that fired on evaluation, by condition",
            ["condition", "policy"],
        )
        self.jobs = counter(
            "ctx_compaction_jobs_total",
            "Budgeter outcomes: enqueued, deduplicated (already pending), deferred, throttled, "
            "not_queued (JetStream refused the job; retried)",
            ["outcome", "reason"],
        )
        self.compactions = counter(
            "ctx_compactions_total",
            "Compaction jobs by result (committed, failed, deferred, dropped, stale) and stage",
            ["result", "stage"],
        )
        self.gateway_checks = counter(
            "ctx_gateway_checks_total",
            "Final checks (ctx.gateway.check) by outcome: ok, context_reprepare_required, or the error code",
            ["outcome"],
        )
        self.manual_compactions = counter(
            "ctx_manual_compactions_total",
            "Manual compactions (ctx.compact) by outcome: committed, or the error code of the reply",
            ["outcome"],
        )
        self.compaction_before_tokens = tokens(
            "ctx_compaction_before_tokens", "View tokens before a committed compaction"
        )
        self.compaction_after_tokens = tokens(
            "ctx_compaction_after_tokens", "View tokens after a committed compaction"
        )
        self.compaction_target = counter(
            "ctx_compaction_target_total",
            "Committed compactions by whether they reached the target ratio",
            ["reached"],
        )
        self.compaction_seconds = latency("ctx_compaction_seconds", "Time to run one compaction job")
        self.summarizer_calls = counter("ctx_summarizer_calls_total", "Summarizer calls", ["summarizer"])
        self.summarizer_tokens = counter(
            "ctx_summarizer_tokens_total",
            "Tokens summarizers reported using, by direction",
            ["summarizer", "direction"],
        )
        self.summarizer_seconds = latency(
            "ctx_summarizer_seconds", "Time spent in summarizer calls per job", ["summarizer"]
        )
        self.revision_conflicts = counter(
            "ctx_revision_conflicts_total", "Optimistic revision checks that lost, by where", ["where"]
        )
        self.read_backs = counter("ctx_read_backs_total", "ctx.read requests, by outcome", ["outcome"])
        self.searches = counter("ctx_searches_total", "ctx.search requests, by outcome", ["outcome"])
        self.search_seconds = latency("ctx_search_seconds", "ctx.search latency")
        self.budgeter_failures = counter(
            "ctx_budgeter_failures_total",
            "Evaluations that failed for what the thread holds (by code): passed over until it moves",
            ["code"],
        )
        self.indexed_records = counter("ctx_indexed_records_total", "Records added to the search index")
        self.index_records_cut = counter(
            "ctx_index_records_cut_total",
            "Records whose searchable text was indexed up to its first MiB only",
        )
        self.index_records_skipped = counter(
            "ctx_index_records_skipped_total",
            "Records the store refused to index (by SQLSTATE), passed once and never retried",
            ["sqlstate"],
        )
        self.queue_jobs = gauge("ctx_compaction_queue_jobs", "Jobs waiting on the compaction queue")
        self.queue_oldest_age = gauge(
            "ctx_compaction_queue_oldest_age_seconds", "Age of the oldest waiting compaction job"
        )
        # Work a worker has not finished, one metric per unit: a sum across units would mean nothing.
        self.consumer_lag_events = gauge(
            "ctx_consumer_lag_events",
            "Events not yet recorded, per recorder partition (consumer p<N>)",
            ["worker", "consumer"],
        )
        self.consumer_lag_jobs = gauge(
            "ctx_consumer_lag_jobs",
            "Compaction jobs pending or unacknowledged on the compactors' durable consumer",
            ["worker", "consumer"],
        )
        self.consumer_lag_threads = gauge(
            "ctx_consumer_lag_threads", "Threads waiting for the budgeter or the indexer", ["worker"]
        )
        self.prepare_errors = counter(
            "ctx_prepare_errors_total", "Prepares answered with an error, by code", ["code"]
        )
        self.requests_rejected = counter(
            "ctx_requests_rejected_total",
            "Requests refused by admission: queue_full/queue_age answered overloaded, "
            "deadline dropped unanswered",
            ["reason"],
        )
        self.replies_refused = counter(
            "ctx_replies_refused_total",
            "Requests dropped unanswered because their reply subject is not the requester's inbox, by "
            "endpoint and reason (not_an_inbox, foreign_inbox)",
            ["endpoint", "reason"],
        )
        self.inflight_requests = gauge("ctx_inflight_requests", "Requests holding a compute slot")
        self.queued_requests = gauge("ctx_queued_requests", "Requests queued for a compute slot")
        self.waiting_requests = gauge(
            "ctx_waiting_requests", "Admitted requests waiting for an event or a compaction (holding no slot)"
        )
        self.request_queue_seconds = latency(
            "ctx_request_queue_seconds", "Time admitted requests queued for a compute slot"
        )
        self.prepare_budget_ratio = histogram(
            "ctx_prepare_budget_ratio",
            "Share of the input budget a prepared context uses",
            ["purpose"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0),
        )

    def watch_view_cache(self, cache: ViewCache) -> None:
        """Export the process's view cache (``ctx_view_cache_*``); once per registry."""
        self._watch("view_cache", partial(_view_cache_metrics, cache))

    def watch_gateway(self, gateway: GatewayService) -> None:
        """Export the gateway write-behind's counts (``ctx_gateway_records_*``); once per registry."""
        self._watch("gateway", partial(_gateway_metrics, gateway))

    def _watch(self, what: str, read: Callable[[], Iterator[Metric]]) -> None:
        if what not in self._watched:
            self.registry.register(_ScrapeCollector(read))
            self._watched.add(what)

    def record_stages(self) -> RecordStages:
        """The recorder's stage observer: each stage's seconds into ``ctx_record_stage_seconds``."""
        return _observer(self.record_stage_seconds, RECORD_STAGES)

    def prepare_stages(self) -> PrepareStages:
        """The assembler's stage observer: each stage's seconds into ``ctx_prepare_stage_seconds``."""
        return _observer(self.prepare_stage_seconds, PREPARE_STAGES)


def _observer(histogram: Histogram, stages: tuple[str, ...]) -> Callable[[Any, float], None]:
    # The children resolved once: ``labels()`` on every observation is a lookup under a lock.
    children = {stage: histogram.labels(stage=stage) for stage in stages}

    def observe(stage: str, seconds: float) -> None:
        children[stage].observe(seconds)

    return observe
