"""Offline evaluation of what the model sees: traces → baseline contexts, probes and metrics (no I/O)."""

from services.core.evaluation.baselines import (
    BASELINES,
    MASK_MARKER,
    Baseline,
    BaselineContext,
    baseline_context,
    mask_old_outputs,
)
from services.core.evaluation.chat import ChatMsg, History, Unit, history_of, with_system_prompt
from services.core.evaluation.counting import ContextCounter, count_context, count_message, count_tools
from services.core.evaluation.probes import PROBE_KINDS, Probe, ProbeKind, haystack_of, is_present, probes_at
from services.core.evaluation.scoring import (
    CTXFLEET,
    SYSTEMS,
    FleetContext,
    FleetFailure,
    FleetOutcome,
    ProbeTally,
    SystemScore,
    TraceScore,
    common_prefix,
    prepare_points,
    score_trace,
)

__all__ = [
    "BASELINES",
    "CTXFLEET",
    "MASK_MARKER",
    "PROBE_KINDS",
    "SYSTEMS",
    "Baseline",
    "BaselineContext",
    "ChatMsg",
    "ContextCounter",
    "FleetContext",
    "FleetFailure",
    "FleetOutcome",
    "History",
    "Probe",
    "ProbeKind",
    "ProbeTally",
    "SystemScore",
    "TraceScore",
    "Unit",
    "baseline_context",
    "common_prefix",
    "count_context",
    "count_message",
    "count_tools",
    "haystack_of",
    "history_of",
    "is_present",
    "mask_old_outputs",
    "prepare_points",
    "probes_at",
    "score_trace",
    "with_system_prompt",
]
