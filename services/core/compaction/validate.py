"""Checks a candidate summary must pass before it may replace history. Pure.

1. It says what the task is (goal or current request) when the thread has one, and what comes next.
2. Every cited record exists; everything but goal and request lies in the covered range — at any
   depth (file changes and views, commands, failed approaches, the hypothesis, folded progress).
3. Every file the covered records modified appears under files_modified.
4. Every failed tool call in the covered records appears under failures, with its real status.
5. The covered range continues the parent exactly.
6. Counts are sane: every command ran at least once, folded progress and actions span a real range.
7. Every state-changing call in the covered records (actions.py) appears under actions — by call
   id or by citing its record — or lies in the range of the folded actions.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from contracts import (
    AssistantMessagePayload,
    ToolOutcomePayload,
    ToolStatus,
)

from services.core.records import LedgerRecord
from services.core.compaction.actions import is_action
from services.core.compaction.files import files_of_call
from services.core.compaction.model import StructuredSummary, cited_seqs

__all__ = ["CandidateInvalid", "validate_candidate"]


class CandidateInvalid(Exception):
    """A candidate summary that fails validation; ``problems`` says how."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


def validate_candidate(
    summary: StructuredSummary,
    *,
    parent: StructuredSummary | None,
    covered: Sequence[LedgerRecord],
    existing_seqs: Collection[int],
    has_request: bool,
) -> None:
    """Raise CandidateInvalid unless ``summary`` may replace ``covered`` (on top of ``parent``)."""
    problems: list[str] = []
    if has_request and summary.goal is None and summary.current_request is None:
        problems.append("no goal or current request")
    if not summary.next_steps:
        problems.append("no next steps")
    expected_from = min(parent.covered_from, covered[0].seq) if parent else covered[0].seq
    if summary.covered_from != expected_from or summary.covered_to < covered[-1].seq:
        problems.append(
            f"covers {summary.covered_from}–{summary.covered_to}, expected {expected_from}–{covered[-1].seq}"
        )
    problems += _check_sources(summary, existing_seqs)
    problems += _check_files(summary, covered)
    problems += _check_failures(summary, covered)
    problems += _check_counts(summary)
    problems += _check_actions(summary, covered)
    if problems:
        raise CandidateInvalid(problems)


def _check_sources(summary: StructuredSummary, existing: Collection[int]) -> list[str]:
    problems = []
    for item in (summary.goal, summary.current_request):
        if item is not None and any(s not in existing for s in item.sources):
            problems.append(f"cites unknown records {sorted(set(item.sources) - set(existing))}")
    ranged = cited_seqs(summary, skip=("goal", "current_request"))
    outside = sorted(
        {s for s in ranged if s not in existing or not summary.covered_from <= s <= summary.covered_to}
    )
    if outside:
        problems.append(f"cites records outside the covered range: {outside[:10]}")
    return problems


def _check_counts(summary: StructuredSummary) -> list[str]:
    problems = [f"command ran {c.runs} times: {c.command[:80]}" for c in summary.commands if c.runs < 1]
    for what, fold in (("progress", summary.folded), ("actions", summary.actions_folded)):
        if fold is not None and (fold.first > fold.last or fold.steps < 1):
            problems.append(f"folded {what} {fold.first}–{fold.last} with {fold.steps} steps")
    return problems


def _check_actions(summary: StructuredSummary, covered: Sequence[LedgerRecord]) -> list[str]:
    ids = {a.call_id for a in summary.actions if a.call_id}
    cited = {s for a in summary.actions for s in a.sources}
    fold = summary.actions_folded
    missing: list[str] = []
    for record in covered:
        body = record.body
        if (
            not isinstance(body, AssistantMessagePayload)
            or record.seq in cited
            or fold is not None
            and fold.first <= record.seq <= fold.last
        ):
            continue
        for call in body.tool_calls:
            if call.call_id not in ids and is_action(call.name, call.args):
                missing.append(f"{call.name} {call.call_id}")
    return [f"actions missing: {missing[:10]}"] if missing else []


def _check_files(summary: StructuredSummary, covered: Sequence[LedgerRecord]) -> list[str]:
    listed = {t.path for t in summary.files_modified}
    missing: list[str] = []
    for record in covered:
        body = record.body
        if not isinstance(body, AssistantMessagePayload):
            continue
        for call in body.tool_calls:
            for path in files_of_call(call.name, call.args).modified:
                if path not in listed and path not in missing:
                    missing.append(path)
    return [f"modified files missing: {missing[:10]}"] if missing else []


def _check_failures(summary: StructuredSummary, covered: Sequence[LedgerRecord]) -> list[str]:
    listed = {(f.call_id, f.status) for f in summary.failures}
    missing = [
        f"{o.call_id} ({o.status})"
        for o in (r.body for r in covered)
        if isinstance(o, ToolOutcomePayload)
        and o.status is not ToolStatus.SUCCESS
        and (o.call_id, o.status.value) not in listed
    ]
    return [f"tool failures missing: {missing[:10]}"] if missing else []
