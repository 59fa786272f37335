"""Task budgets: the ledger from recorded calls, what is left, and the refusal of a spent hard budget."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts import ErrorCode
from contracts.task_budgets import BudgetLedger, TaskBudget
from services.core.records import LedgerRecord, RecordKind, TokenCounts
from services.core.task_budget import ensure_within, ledger_of, task_budget_report
from services.errors import TaskBudgetExhausted


def _rec(seq: int, kind: RecordKind, tokens: int, *, calls: int = 0, thread: str = "r.a") -> LedgerRecord:
    payload: dict[str, object] = {"text": "x"}
    if kind is RecordKind.ASSISTANT_MESSAGE:
        payload = {
            "text": "x",
            "tool_calls": [{"call_id": f"c{seq}-{n}", "name": "t", "args": {}} for n in range(calls)],
        }
    return LedgerRecord(
        seq=seq,
        event_key=f"k{seq}",
        kind=kind,
        payload=payload,  # type: ignore[arg-type]
        text="x",
        tokens=TokenCounts(tokens, tokens),
        thread_id=thread,
    )


A, T, U = RecordKind.ASSISTANT_MESSAGE, RecordKind.TOOL_OUTCOME, RecordKind.USER_INPUT


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


def test_task_budget_needs_at_least_one_limit() -> None:
    with pytest.raises(ValidationError):
        TaskBudget()
    with pytest.raises(ValidationError):
        TaskBudget(model_calls=0)


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
