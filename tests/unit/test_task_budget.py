"""Task budgets: the ledger from recorded calls, what is left, and the refusal of a spent hard budget."""

from __future__ import annotations

from contracts import EventKind

from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from contracts import ErrorCode
from contracts.task_budgets import BudgetLedger, TaskBudget
from services.core.records import LedgerRecord, TokenCounts
from services.core.task_budget import ensure_within, ledger_of, task_budget_report
from contracts.exceptions import TaskBudgetExhausted


_T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _rec(
    seq: int,
    kind: EventKind,
    tokens: int,
    *,
    calls: int = 0,
    thread: str = "r.a",
    usage: dict[str, object] | None = None,
    at_s: float | None = None,
) -> LedgerRecord:
    payload: dict[str, object] = {"text": "x", "call_id": f"c{seq}"} if kind is EventKind.TOOL_OUTCOME else {}
    if kind is EventKind.ASSISTANT_MESSAGE:
        payload = {
            "text": "x",
            "tool_calls": [{"call_id": f"c{seq}-{n}", "name": "t", "args": {}} for n in range(calls)],
        }
        if usage is not None:
            payload["usage"] = usage
    return LedgerRecord(
        seq=seq,
        event_key=f"k{seq}",
        kind=kind,
        payload=payload,  # type: ignore[arg-type]
        text="x",
        tokens=TokenCounts(tokens, tokens),
        thread_id=thread,
        recorded_at=None if at_s is None else _T0 + timedelta(seconds=at_s),
    )


A, T, U = EventKind.ASSISTANT_MESSAGE, EventKind.TOOL_OUTCOME, EventKind.USER_INPUT


@pytest.mark.parametrize(
    ("records", "input_budget", "ledger"),
    [
        ([], 1000, BudgetLedger()),
        ([_rec(1, U, 100)], 1000, BudgetLedger()),
        # call 1 was sent the 100-token question; call 2 that plus call 1 (20) and its outcome (300)
        (
            [_rec(1, U, 100), _rec(2, A, 20, calls=2), _rec(3, T, 300), _rec(4, T, 5), _rec(5, A, 30)],
            1000,
            BudgetLedger(
                model_calls=2, tool_calls=2, output_tokens=50, input_tokens=100 + 425, total_tokens=575
            ),
        ),
        # a call is never sent more than the input budget
        (
            [_rec(1, U, 5000), _rec(2, A, 10)],
            1000,
            BudgetLedger(model_calls=1, output_tokens=10, input_tokens=1000, total_tokens=1010),
        ),
        # another thread's calls are not this run's spending; its tokens are history a call may see
        (
            [_rec(1, A, 40, calls=3, thread="r.parent"), _rec(2, A, 10)],
            1000,
            BudgetLedger(model_calls=1, output_tokens=10, input_tokens=40, total_tokens=50),
        ),
    ],
)
def test_ledger_of_accumulates_recorded_calls_of_the_own_thread(
    records: list[LedgerRecord], input_budget: int, ledger: BudgetLedger
) -> None:
    assert ledger_of(records, own_thread="r.a", input_budget=input_budget) == ledger


def test_ledger_of_takes_the_providers_numbers_where_a_response_reported_them() -> None:
    records = [
        _rec(1, U, 100),
        _rec(2, A, 20, usage={"input_tokens": 130, "output_tokens": 25, "cost": 0.5}),
        _rec(3, T, 300),
        _rec(4, A, 30, usage={"input_tokens": 460, "output_tokens": 31}),  # usage without a cost
        _rec(5, T, 10),
        _rec(6, A, 40),  # no usage: the local estimate
    ]

    assert ledger_of(records, own_thread="r.a", input_budget=1000) == BudgetLedger(
        model_calls=3,
        input_tokens=130 + 460 + (100 + 20 + 300 + 30 + 10),
        output_tokens=25 + 31 + 40,
        total_tokens=590 + 460 + 96,
        cost=0.5,
        reported_calls=2,
        priced_calls=1,
    )


def test_ledger_of_runtime_is_the_span_of_the_own_threads_recorded_times() -> None:
    records = [
        _rec(1, A, 5, thread="r.parent", at_s=0),  # before the run's own thread began: not its time
        _rec(2, U, 5, at_s=10),
        _rec(3, A, 5, at_s=40.9),
        _rec(4, T, 5, at_s=130.7),
    ]

    assert ledger_of(records, own_thread="r.a", input_budget=1000).runtime_seconds == 120
    assert ledger_of(records[:2], own_thread="r.a", input_budget=1000).runtime_seconds == 0


def test_task_budget_needs_at_least_one_limit() -> None:
    with pytest.raises(ValidationError):
        TaskBudget()
    with pytest.raises(ValidationError):
        TaskBudget(model_calls=0)
    with pytest.raises(ValidationError):
        TaskBudget(cost=-1.0)
    assert TaskBudget(runtime_seconds=60).runtime_seconds == 60 and TaskBudget(cost=2.5).cost == 2.5


@pytest.mark.parametrize(
    ("budget", "spent", "remaining", "exhausted"),
    [
        (TaskBudget(model_calls=3), BudgetLedger(model_calls=2), {"model_calls": 1}, ()),
        (TaskBudget(model_calls=3), BudgetLedger(model_calls=3), {"model_calls": 0}, ("model_calls",)),
        (TaskBudget(model_calls=3), BudgetLedger(model_calls=5), {"model_calls": 0}, ("model_calls",)),
        (
            TaskBudget(total_tokens=100, tool_calls=2),
            BudgetLedger(tool_calls=2, total_tokens=40),
            {"total_tokens": 60, "tool_calls": 0},
            ("tool_calls",),
        ),
        (
            TaskBudget(cost=1.0, runtime_seconds=600),
            BudgetLedger(cost=0.7, runtime_seconds=600),
            {"cost": 0.3, "runtime_seconds": 0},
            ("runtime_seconds",),
        ),
        (TaskBudget(cost=0.3), BudgetLedger(cost=0.1 + 0.2), {"cost": 0.0}, ("cost",)),
    ],
)
def test_task_budget_report_is_spent_when_a_dimension_reaches_its_limit(
    budget: TaskBudget, spent: BudgetLedger, remaining: dict[str, int], exhausted: tuple[str, ...]
) -> None:
    report = task_budget_report(budget, spent)
    assert (report.remaining, report.exhausted) == (remaining, exhausted)


def test_ensure_within_refuses_a_spent_hard_budget_with_the_ledger() -> None:
    report = task_budget_report(TaskBudget(model_calls=1), BudgetLedger(model_calls=1, output_tokens=7))
    with pytest.raises(TaskBudgetExhausted) as err:
        ensure_within(report, "r.a")
    reply = err.value.to_reply()
    assert reply.code is ErrorCode.TASK_BUDGET_EXHAUSTED and not reply.retryable
    assert reply.details["spent"] == BudgetLedger(model_calls=1, output_tokens=7).model_dump(mode="json")
    assert reply.details["exhausted"] == ["model_calls"]


def test_ensure_within_lets_a_spent_soft_budget_through() -> None:
    report = task_budget_report(TaskBudget(model_calls=1, hard=False), BudgetLedger(model_calls=4))
    ensure_within(report, "r.a")
    assert report.exhausted == ("model_calls",)
