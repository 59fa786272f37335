"""The budget ledger of a run and its task budget's verdict. Pure.

Invariants:
1. The ledger derives from recorded records only: replaying the same records gives the same ledger,
   so a restart loses nothing. Runtime is read from the records' ``recorded_at``, never a clock.
2. Only the run's own thread counts; inherited or exported history is not this run's spending.
3. A dimension is spent when its spending reaches the limit (``>=``): the next call would exceed it.
4. A hard budget with a spent dimension refuses the prepare (``TaskBudgetExhausted``) with the report;
   a soft one only reports.
5. A call's tokens are the provider's where its response reported usage, else the local estimate;
   the ledger counts which (``reported_calls``). Cost is only ever reported (``priced_calls``).
"""

from __future__ import annotations

from contracts import (
    AssistantMessagePayload,
    EventKind,
)

from collections.abc import Sequence
from datetime import datetime

from contracts.task_budgets import TASK_BUDGET_DIMENSIONS, BudgetLedger, TaskBudget, TaskBudgetReport

from services.core.records import LedgerRecord
from services.core.tokens import EncodingName
from contracts.exceptions import TaskBudgetExhausted

__all__ = ["ensure_within", "ledger_of", "task_budget_report"]


def ledger_of(
    records: Sequence[LedgerRecord],
    *,
    own_thread: str,
    input_budget: int,
    encoding: EncodingName = "o200k_base",
) -> BudgetLedger:
    """What the run of ``own_thread`` spent, from its records in seq order."""
    history = 0  # tokens recorded before the record at hand, any thread (what a call could be sent)
    calls = tools = output = sent = reported = priced = 0
    cost = 0.0
    times: list[datetime] = []
    for record in sorted(records, key=lambda r: r.seq):
        tokens = record.tokens.get(encoding)
        mine = not own_thread or not record.thread_id or record.thread_id == own_thread
        if mine and record.recorded_at is not None:
            times.append(record.recorded_at)
        body = record.body
        if mine and record.kind is EventKind.ASSISTANT_MESSAGE and isinstance(body, AssistantMessagePayload):
            calls += 1
            tools += len(body.tool_calls)
            usage = body.usage
            if usage is None:
                output += tokens
                sent += min(history, input_budget)
            else:
                reported += 1
                output += usage.output_tokens
                sent += usage.input_tokens
                if usage.cost is not None:
                    priced += 1
                    cost += usage.cost
        history += tokens
    return BudgetLedger(
        model_calls=calls,
        tool_calls=tools,
        output_tokens=output,
        input_tokens=sent,
        total_tokens=sent + output,
        runtime_seconds=_seconds_between(times),
        cost=round(cost, 9),
        reported_calls=reported,
        priced_calls=priced,
    )


def _seconds_between(times: Sequence[datetime]) -> int:
    """Whole seconds from the earliest to the latest time (0 for fewer than two)."""
    if len(times) < 2:
        return 0
    return int((max(times) - min(times)).total_seconds())


def task_budget_report(budget: TaskBudget, spent: BudgetLedger) -> TaskBudgetReport:
    """The report of ``budget`` after ``spent``: what is left and what is exhausted."""
    limits: dict[str, int | float] = {}
    remaining: dict[str, int | float] = {}
    exhausted: list[str] = []
    for name in TASK_BUDGET_DIMENSIONS:
        limit: int | float | None = getattr(budget, name)
        if limit is None:
            continue
        limits[name] = limit
        used: int | float = getattr(spent, name)
        # Cost is a sum of decimals: rounded so that a limit met exactly reads as 0 left, not 1e-17.
        left = max(0, limit - used)
        remaining[name] = round(left, 9) if isinstance(left, float) else left
        if used >= limit:
            exhausted.append(name)
    return TaskBudgetReport(
        limits=limits, hard=budget.hard, spent=spent, remaining=remaining, exhausted=tuple(exhausted)
    )


def ensure_within(report: TaskBudgetReport, thread_id: str) -> None:
    """Refuse when a hard budget is spent; a soft budget's report stands as it is."""
    if report.hard and report.exhausted:
        raise TaskBudgetExhausted(thread_id, report)
