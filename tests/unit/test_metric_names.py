"""Every metric the workers export follows Prometheus's naming conventions.

The rules (https://prometheus.io/docs/practices/naming/): a name ends in its unit, one unit per
metric, in its base form (seconds, bytes); counters end in ``_total``; a name says what is measured,
not how it is broken down; label values are bounded. ``naming_violations`` holds a registry to them
and ``exposition_violations`` a scraped page, so ``tests/integration/test_metrics_after_a_run.py``
can hold a real fleet's ``/metrics`` to the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from services.app.final_checks import GatewayService
from services.app.view_cache import ViewCache
from services.store.final_checks import MemoryGatewayStore, MemoryHookGrants
from workers.metrics import FleetMetrics, policy_label

# Units a value is measured in: the name's last word, and nowhere else in it.
BASE_UNITS = frozenset({"seconds", "bytes", "tokens", "ratio"})
# What a gauge or a histogram of counts counts, as its last word.
COUNTED = frozenset({"events", "jobs", "threads", "requests", "records", "entries", "views"})
# Gauges that hold a state or a position rather than an amount: there is no unit to name.
UNITLESS = frozenset({"ctx_recorder_halted", "ctx_recorder_position"})


def naming_violations(families: Iterable[Metric]) -> list[str]:
    """Each way a family's name breaks the conventions, as ``name: what``."""
    found = []
    for family in families:
        name, words = family.name, family.name.split("_")
        if words[0] != "ctx":
            found.append(f"{name}: not under the ctx_ prefix")
        if "by" in words:
            found.append(f"{name}: names a breakdown, which belongs in a label")
        misplaced = BASE_UNITS & set(words[:-1])
        if misplaced:
            found.append(f"{name}: its unit {sorted(misplaced)} is not last")
        if family.type == "counter":
            # prometheus-client keeps a counter family's name without the suffix its samples carry.
            if name.endswith("_total") or any(not s.name.endswith("_total") for s in family.samples):
                found.append(f"{name}: a counter's samples end in _total, once")
        elif name not in UNITLESS and words[-1] not in BASE_UNITS | COUNTED:
            found.append(
                f"{name}: a {family.type} ends in a unit ({', '.join(sorted(BASE_UNITS | COUNTED))})"
            )
        found += [f"{name}: exposes {s.name}" for s in family.samples if s.name.endswith("_created")]
        found += [
            f"{name}: label {key}={value!r} carries a revision"
            for s in family.samples
            for key, value in s.labels.items()
            if "@" in value
        ]
    return found


def exposition_violations(text: str) -> list[str]:
    """``naming_violations`` of a scraped ``/metrics`` page, plus any ``*_created`` line on it."""
    created = [line for line in text.splitlines() if "_created" in line]
    return [f"exposed: {line}" for line in created] + naming_violations(
        f for f in text_string_to_metric_families(text) if f.name.startswith("ctx_")
    )


def _every_collector() -> FleetMetrics:
    metrics = FleetMetrics()
    metrics.watch_view_cache(ViewCache())
    metrics.watch_gateway(GatewayService(MemoryGatewayStore(), MemoryHookGrants()))
    return metrics


def test_every_metric_the_workers_define_follows_the_conventions() -> None:
    assert naming_violations(_every_collector().registry.collect()) == []


def test_the_exposition_carries_no_created_series() -> None:
    metrics = _every_collector()
    metrics.events_recorded.inc()
    metrics.prepare_seconds.labels(purpose="action", policy="default").observe(0.01)
    text = generate_latest(metrics.registry).decode()
    assert "ctx_events_recorded_total 1.0" in text.splitlines()
    assert exposition_violations(text) == []


def test_the_rules_catch_the_names_they_forbid() -> None:
    registry = CollectorRegistry()
    Histogram("ctx_compaction_tokens_before", "unit in the middle", registry=registry)
    Histogram("ctx_prepare_input_budget", "no unit", registry=registry)
    Gauge("ctx_consumer_lag", "no unit", registry=registry)
    Counter("ctx_prepares_by_level", "a breakdown in the name", ["level"], registry=registry)
    Counter("ctx_trigger_hits", "a revision in a label", ["policy"], registry=registry).labels(
        "default@3"
    ).inc()
    found = naming_violations(registry.collect())
    assert {v.split(":")[0] for v in found} == {
        "ctx_compaction_tokens_before",
        "ctx_prepare_input_budget",
        "ctx_consumer_lag",
        "ctx_prepares_by_level",
        "ctx_trigger_hits",
    }
    assert "exposed: ctx_x_created 1.7e9" in exposition_violations("ctx_x_created 1.7e9\n")


def test_a_policy_is_labelled_by_its_name_whatever_its_revision() -> None:
    assert policy_label("default@1") == policy_label("default@12") == "default"
    assert policy_label("gpt-4o") == "gpt-4o"  # a profile, with no revision
