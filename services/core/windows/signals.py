"""What a window's records say about closing it: open tool groups, operations, low-value share. Pure.

Only the thread's own records after the window's opening count: inherited history is another
run's, and what an earlier window held is no longer in view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts import (
    AssistantMessagePayload,
    OperationReconcilePayload,
    PathRule,
    PhaseChangePayload,
    ToolOutcomePayload,
    ToolStatus,
)

from services.core.records import LedgerRecord
from services.core.state import StateView, pattern_regex
from services.core.tokens import EncodingName

__all__ = [
    "Operations",
    "low_value_share",
    "open_calls",
    "operations_of",
    "path_kind",
    "phase_boundary",
    "recovery_boundary",
    "window_records",
]

# The newest groups are what the next step works with: never low-value, however large.
_RECENT_GROUPS = 2


def window_records(records: Sequence[LedgerRecord], opened_after: int, own_thread: str) -> list[LedgerRecord]:
    """The thread's own records of the window that opened after session seq ``opened_after``."""
    return [r for r in records if r.seq > opened_after and (not r.thread_id or r.thread_id == own_thread)]


def open_calls(records: Sequence[LedgerRecord]) -> tuple[str, ...]:
    """Call ids of ``records`` still waiting for their result, in call order."""
    answered = {r.body.call_id for r in records if isinstance(r.body, ToolOutcomePayload)}
    return tuple(
        c.call_id
        for r in records
        if isinstance(r.body, AssistantMessagePayload)
        for c in r.body.tool_calls
        if c.call_id not in answered
    )


@dataclass(frozen=True, slots=True)
class Operations:
    """Operation ids of side-effecting calls: still unsettled, and the most recent with a receipt."""

    active: tuple[str, ...]
    recent: tuple[str, ...]


def operations_of(records: Sequence[LedgerRecord], *, recent: int = 10) -> Operations:
    """Operations of ``records``: unsettled ones (no result, or an unknown or timed-out one not yet
    reconciled) are carried as active; the newest ``recent`` operation ids are the recent receipts."""
    status: dict[str, ToolStatus] = {}
    for r in records:
        if isinstance(r.body, ToolOutcomePayload):
            status[r.body.call_id] = r.body.status
    reconciled = {r.body.operation_id for r in records if isinstance(r.body, OperationReconcilePayload)}
    ordered: list[tuple[str, str]] = [
        (c.operation_id, c.call_id)
        for r in records
        if isinstance(r.body, AssistantMessagePayload)
        for c in r.body.tool_calls
        if c.operation_id is not None
    ]
    unsettled = (None, ToolStatus.UNKNOWN, ToolStatus.TIMEOUT)
    active = tuple(op for op, call in ordered if status.get(call) in unsettled and op not in reconciled)
    return Operations(active, tuple(op for op, _ in ordered)[-recent:])


def low_value_share(records: Sequence[LedgerRecord], encoding: EncodingName = "o200k_base") -> float:
    """Share of the window's tokens held by tool outputs older than its newest groups (closing
    trigger 4): bulk the next step no longer works with, which a clean window leaves in the ledger."""
    total = sum(r.tokens.get(encoding) for r in records)
    if total == 0:
        return 0.0
    outcomes = [(r, r.body.call_id) for r in records if isinstance(r.body, ToolOutcomePayload)]
    recent_calls = {call for _, call in outcomes[-_RECENT_GROUPS:]}
    return sum(r.tokens.get(encoding) for r, call in outcomes if call not in recent_calls) / total


def phase_boundary(records: Sequence[LedgerRecord], opened_after: int) -> bool:
    """Whether the runtime moved the task to another phase inside the window that opened after
    ``opened_after``, once the window had done some work in the phase before.

    ``records`` are the thread's own, from its start: the phase in force when the window opened is
    the last one declared before. A model's proposal is recorded and decides nothing (§35); a change
    before the window's first model step finds the window already clean.
    """
    phase: str | None = None
    worked = False
    for r in records:
        body = r.body
        if isinstance(body, AssistantMessagePayload) and r.seq > opened_after:
            worked = True
        if not isinstance(body, PhaseChangePayload) or body.source != "runtime":
            continue
        if r.seq > opened_after and worked and body.phase != phase:
            return True
        phase = body.phase
    return False


def recovery_boundary(state: StateView, rules: Sequence[PathRule], window: Sequence[LedgerRecord]) -> bool:
    """Whether a plan completed inside the window (closing trigger 5): a stable checkpoint, after
    which the next stage may start in a clean window. ``window`` is the window's own records."""
    keys = {r.event_key for r in window}
    return any(
        f.value == "completed" and f.event_key in keys and path_kind(f.path, rules) == "plan"
        for f in state.facts.values()
    )


def path_kind(path: str, rules: Sequence[PathRule]) -> str:
    """The kind the session catalog registers for ``path`` (``business_fact`` when none matches)."""
    for rule in rules:
        if pattern_regex(rule.pattern).fullmatch(path):
            return rule.kind
    return "business_fact"
