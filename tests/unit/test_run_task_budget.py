"""A task budget declared once on a run's first event, reported usage and runtime in the ledger,
through the recorder's and the assembler's shells on the in-memory store (no server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from contracts import ErrorCode
from contracts.events import EventDecodeError, decode_event
from contracts.task_budgets import CallUsage, TaskBudget
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.core.ledger import RecordingLimits
from contracts.exceptions import TaskBudgetExhausted
from services.store.memory import MemoryStore
from tests.fixtures.builders import LetterSink, Thread, incoming, prepare_request

pytestmark = pytest.mark.anyio


def _clock(step_s: int) -> Iterator[datetime]:
    at = datetime(2026, 12, 1, tzinfo=timezone.utc)
    while True:
        yield at
        at += timedelta(seconds=step_s)


async def _record(store: MemoryStore, events: list[Any], start: int = 1) -> None:
    sink = LetterSink()
    recorder = RecordingService(store, sink, limits=RecordingLimits(), recorder_id="unit")
    await recorder.record_batch(0, incoming(events, start_seq=start))
    assert sink.letters == []


def _budgeted(t: Thread, budget: dict[str, Any], key: str = "sys") -> Any:
    event = t.system("You fix bugs.", key=key)
    return event.model_copy(update={"task_budget": TaskBudget.model_validate(budget)})


def _steps(t: Thread) -> list[Any]:
    return [
        t.user("Fix the parser."),
        t.assistant("Looking.", calls=(("c1", "bash", {"cmd": "pytest -x"}),)),
        t.outcome("c1", "E AssertionError"),
        t.assistant("Reading.", calls=(("c2", "read", {"path": "parser.py"}),)),
        t.outcome("c2", "def parse(): ..."),
    ]


async def test_a_run_budget_declared_on_its_first_event_is_reported_and_survives_a_restart() -> None:
    store, t = MemoryStore(), Thread()
    await _record(store, [_budgeted(t, {"model_calls": 5}), *_steps(t)])

    prepared = await PrepareService(store, NoticeBoard()).prepare(prepare_request(t))
    report = prepared.task_budget
    assert report is not None
    assert (report.limits, report.remaining) == ({"model_calls": 5}, {"model_calls": 3})
    # A new assembler (a restart, another replica) reads the run's budget from the store.
    again = await PrepareService(store, NoticeBoard()).prepare(prepare_request(t))
    assert again.task_budget == report


async def test_a_prepares_own_budget_overrides_the_runs_and_a_later_events_budget_is_not_honoured() -> None:
    store, t = MemoryStore(), Thread()
    await _record(store, [_budgeted(t, {"model_calls": 5}), *_steps(t)])
    # Declared after the run started: not the run's budget (as a later event's policy is not).
    late = t.user("and hurry").model_copy(update={"task_budget": TaskBudget(model_calls=1)})
    await _record(store, [late], start=7)
    service = PrepareService(store, NoticeBoard())

    own = await service.prepare(prepare_request(t, task_budget={"tool_calls": 10, "hard": False}))
    assert own.task_budget is not None and own.task_budget.limits == {"tool_calls": 10}
    run = await service.prepare(prepare_request(t))
    assert run.task_budget is not None and run.task_budget.limits == {"model_calls": 5}


async def test_a_run_without_a_declared_budget_reports_none() -> None:
    store, t = MemoryStore(), Thread()
    await _record(store, [t.system("You fix bugs."), *_steps(t)])

    assert (await PrepareService(store, NoticeBoard()).prepare(prepare_request(t))).task_budget is None


async def test_the_ledger_takes_reported_usage_and_cost_where_a_response_has_them() -> None:
    store, t = MemoryStore(), Thread()
    steps = _steps(t)
    reported = steps[1].payload.model_copy(
        update={"usage": CallUsage(input_tokens=1_234, output_tokens=56, cost=0.25)}
    )
    steps[1] = steps[1].model_copy(update={"payload": reported})
    await _record(store, [_budgeted(t, {"cost": 0.25, "hard": False}), *steps])

    prepared = await PrepareService(store, NoticeBoard()).prepare(prepare_request(t))
    report = prepared.task_budget
    assert report is not None
    spent = report.spent
    # One call reported (its numbers are the provider's), one estimated; only the reported cost counts.
    assert (spent.model_calls, spent.reported_calls, spent.priced_calls, spent.cost) == (2, 1, 1, 0.25)
    assert spent.input_tokens > 1_234 and spent.output_tokens > 56
    assert (report.remaining, report.exhausted) == ({"cost": 0.0}, ("cost",))


async def test_a_hard_runtime_budget_is_spent_by_the_time_between_the_runs_first_and_newest_record() -> None:
    clock = _clock(step_s=20)
    store, t = MemoryStore(wall=lambda: next(clock)), Thread()
    # Six records twenty seconds apart (the store's clock): 100 seconds of runtime.
    await _record(store, [_budgeted(t, {"runtime_seconds": 100}), *_steps(t)])

    with pytest.raises(TaskBudgetExhausted) as err:
        await PrepareService(store, NoticeBoard()).prepare(prepare_request(t))
    assert err.value.details["exhausted"] == ["runtime_seconds"]
    assert err.value.details["spent"]["runtime_seconds"] == 100  # type: ignore[index]


@pytest.mark.parametrize(
    "change",
    [
        {"task_budget": {}},  # no limit at all
        {"task_budget": {"cost": -1}},
        {"task_budget": {"runtime_seconds": 0}},
        {"payload": {"text": "x", "usage": {"input_tokens": -5, "output_tokens": 1}}},
        {"payload": {"text": "x", "usage": {"input_tokens": 5}}},  # output_tokens missing
    ],
)
def test_a_bad_task_budget_or_usage_is_an_invalid_event(change: dict[str, Any]) -> None:
    t = Thread()
    event = {**json.loads(t.assistant("x").model_dump_json()), **change}

    with pytest.raises(EventDecodeError) as err:
        decode_event(json.dumps(event).encode(), max_bytes=1 << 20)
    assert err.value.code is ErrorCode.INVALID_EVENT
