"""The garbage collector's pauses are timed into the fleet's metrics while its workers run."""

from __future__ import annotations

import gc

from workers.metrics import FleetMetrics


def _full_collections(metrics: FleetMetrics) -> float:
    value = metrics.registry.get_sample_value("ctx_gc_pause_seconds_count", {"generation": "2"})
    return value or 0.0


def test_a_full_collection_is_timed_while_installed_and_not_after() -> None:
    metrics = FleetMetrics()
    metrics.gc_pauses.install()
    metrics.gc_pauses.install()  # twice is once: a restarted fleet must not count a pause twice
    try:
        gc.collect()
        assert _full_collections(metrics) == 1
        assert metrics.gc_pauses.longest_s > 0
    finally:
        metrics.gc_pauses.uninstall()
    gc.collect()
    assert _full_collections(metrics) == 1
