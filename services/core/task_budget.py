"""The budget ledger of a run and its task budget's verdict (seed 004 §26–27). Pure.

Invariants:
1. The ledger derives from recorded records only: replaying the same records gives the same ledger,
   so a restart loses nothing.
2. Only the run's own thread counts; inherited or exported history is not this run's spending.
3. A dimension is spent when its spending reaches the limit (``>=``): the next call would exceed it.
4. A hard budget with a spent dimension refuses the prepare (``TaskBudgetExhausted``) with the report;
   a soft one only reports.
"""

from __future__ import annotations

from collections.abc import Sequence

from contracts.task_budgets import BudgetLedger, TaskBudget, TaskBudgetReport

from services.core.records import AssistantMessageBody, LedgerRecord, RecordKind
from services.core.tokens import EncodingName
from services.errors import TaskBudgetExhausted

__all__ = ["DIMENSIONS", "ensure_within", "ledger_of", "task_budget_report"]

# The limited dimensions, in report order: each is a field of both TaskBudget and BudgetLedger.
DIMENSIONS = ("input_tokens", "output_tokens", "total_tokens", "model_calls", "tool_calls")


def ledger_of(
    records: Sequence[LedgerRecord],
    *,
    own_thread: str,
    input_budget: int,
    encoding: EncodingName = "o200k_base",
) -> BudgetLedger:
    """What the run of ``own_thread`` spent, from its records in seq order."""
    history = 0  # tokens recorded before the record at hand, any thread (what a call could be sent)
    calls = tools = output = sent = 0
    for record in sorted(records, key=lambda r: r.seq):
        tokens = record.tokens.get(encoding)
        mine = not own_thread or not record.thread_id or record.thread_id == own_thread
        body = record.body
        if mine and record.kind is RecordKind.ASSISTANT_MESSAGE and isinstance(body, AssistantMessageBody):
            calls += 1
            tools += len(body.tool_calls)
            output += tokens
            sent += min(history, input_budget)
        history += tokens
    return BudgetLedger(
        model_calls=calls,
        tool_calls=tools,
        output_tokens=output,
        input_tokens=sent,
        total_tokens=sent + output,
    )


def task_budget_report(budget: TaskBudget, spent: BudgetLedger) -> TaskBudgetReport:
    """The report of ``budget`` after ``spent``: what is left and what is exhausted."""
    limits: dict[str, int] = {}
    remaining: dict[str, int] = {}
    exhausted: list[str] = []
    for name in DIMENSIONS:
        limit = getattr(budget, name)
        if limit is None:
            continue
        limits[name] = limit
        used: int = getattr(spent, name)
        remaining[name] = max(0, limit - used)
        if used >= limit:
            exhausted.append(name)
    return TaskBudgetReport(
        limits=limits, hard=budget.hard, spent=spent, remaining=remaining, exhausted=tuple(exhausted)
    )


def ensure_within(report: TaskBudgetReport, thread_id: str) -> None:
    """Refuse when a hard budget is spent; a soft budget's report stands as it is."""
    if report.hard and report.exhausted:
        raise TaskBudgetExhausted(thread_id, report)
