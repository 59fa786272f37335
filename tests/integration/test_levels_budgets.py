"""Water levels, forecasts and task budgets through a real fleet."""

from __future__ import annotations

import pytest

from contracts import ContextPolicy
from contracts.task_budgets import CallUsage, TaskBudget
from contracts.windows import WaterLevel, WindowPolicy, WindowStrategy
from ctxfleet_client.client import FleetClient
from contracts.exceptions import TaskBudgetExhausted
from tests.fixtures.builders import Thread, prepare_request as _request

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def _two_steps(client: FleetClient, t: Thread) -> str:
    await client.append(t.system("You fix bugs."))
    await client.append(t.user("Fix the failing parser test."))
    await client.append(t.assistant("Looking.", calls=(("c1", "bash", {"cmd": "pytest -x"}),)))
    await client.append(t.outcome("c1", "E AssertionError\n" * 20))
    await client.append(t.assistant("Reading.", calls=(("c2", "read", {"path": "parser.py"}),)))
    await client.append(t.outcome("c2", "def parse(): ...", key="last"))
    return "last"


async def test_prepare_reports_level_safe_remaining_and_forecast(fleet, client: FleetClient) -> None:
    t = Thread()
    last = await _two_steps(client, t)
    prepared = await client.prepare(
        _request(
            t, after_event_key=last, budget_tokens=10_000, forecast={"tool_calls": 2, "expected_steps": 2}
        )
    )
    window = prepared.window_report
    assert window is not None
    used = prepared.budget_report.used.total
    assert (window.level, window.used, window.input_budget, window.safe_remaining) == (
        WaterLevel.GREEN,
        used,
        10_000,
        9_000 - used,
    )
    # one closed step (the first assistant message and its outcome), two declared tool calls at 800
    assert (window.forecast.observed_steps, window.forecast.steps, window.forecast.declared) == (1, 2, 1600)
    assert window.forecast.tokens == window.forecast.step_growth * 2 + 1600
    assert window.forecast.fits is (window.forecast.tokens <= window.safe_remaining)


async def test_prepare_reports_the_task_budget_left_and_refuses_a_spent_hard_budget(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    last = await _two_steps(client, t)
    open_budget = await client.prepare(_request(t, after_event_key=last, task_budget={"model_calls": 5}))
    report = open_budget.task_budget
    assert report is not None
    assert (report.spent.model_calls, report.spent.tool_calls, report.remaining) == (2, 2, {"model_calls": 3})
    soft = await client.prepare(_request(t, task_budget={"tool_calls": 2, "hard": False}))
    assert soft.task_budget is not None and soft.task_budget.exhausted == ("tool_calls",)
    with pytest.raises(TaskBudgetExhausted) as err:
        await client.prepare(_request(t, task_budget={"model_calls": 2, "total_tokens": 1_000_000}))
    details = err.value.details
    assert details["exhausted"] == ["model_calls"]
    assert details["spent"]["model_calls"] == 2 and details["spent"]["tool_calls"] == 2  # type: ignore[index]
    assert details["remaining"] == {
        "model_calls": 0,
        "total_tokens": 1_000_000 - details["spent"]["total_tokens"],
    }  # type: ignore[index,operator]


async def test_a_rollover_policy_trims_optional_material_at_yellow(fleet, client: FleetClient) -> None:
    t = Thread()
    # A policy budget far above the contexts here: no compaction trigger fires during the test.
    policy = ContextPolicy(
        name=f"rollover-{t.session_id}",
        model_profile=None,
        budget_tokens=1_000_000,
        window=WindowPolicy(strategy=WindowStrategy.ROLLOVER),
    )
    await client.register_policy(policy)
    await client.append(t.system("You fix bugs.").model_copy(update={"policy": policy.name}))
    await client.append(t.user("Fix the parser."))
    await client.append(t.resource("doc:style", "style guide line\n" * 200))
    await client.append(t.assistant("Reading.", calls=(("c1", "read", {"path": "parser.py"}),)))
    await client.append(t.outcome("c1", "def parse(): ...", key="last"))
    roomy = await client.prepare(_request(t, after_event_key="last", budget_tokens=100_000))
    assert (
        roomy.window_report is not None
        and roomy.window_report.level is WaterLevel.GREEN
        and not roomy.omitted
    )
    at_yellow = int(roomy.budget_report.used.total / 0.7)  # the whole view would be 70 %
    trimmed = await client.prepare(_request(t, budget_tokens=at_yellow))
    assert trimmed.window_report is not None
    assert (trimmed.window_report.level, trimmed.window_report.trimmed) == (WaterLevel.GREEN, True)
    assert [o.kind.value for o in trimmed.omitted] == ["material"]


async def test_a_budget_declared_on_the_runs_first_event_is_reported_without_the_prepare_naming_one(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    first = t.system("You fix bugs.").model_copy(update={"task_budget": TaskBudget(model_calls=2)})
    await client.append(first)
    await client.append(t.user("Fix the failing parser test."))
    reported = CallUsage(input_tokens=900, output_tokens=40, cost=0.01)
    call = t.assistant("Looking.", calls=(("c1", "bash", {"cmd": "pytest -x"}),))
    await client.append(
        call.model_copy(update={"payload": call.payload.model_copy(update={"usage": reported})})
    )
    await client.append(t.outcome("c1", "E AssertionError", key="last"))

    prepared = await client.prepare(_request(t, after_event_key="last"))
    report = prepared.task_budget
    assert report is not None and report.limits == {"model_calls": 2}
    spent = report.spent
    assert (spent.model_calls, spent.reported_calls, spent.input_tokens, spent.output_tokens) == (
        1,
        1,
        900,
        40,
    )
    assert spent.cost == 0.01
    # The prepare's own budget overrides the run's.
    own = await client.prepare(_request(t, task_budget={"cost": 0.5}))
    assert own.task_budget is not None and own.task_budget.remaining == {"cost": 0.49}
