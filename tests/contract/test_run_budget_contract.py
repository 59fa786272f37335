"""A run's task budget (declared on its first event) is kept with the run alike on both stores."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.task_budgets import TaskBudget
from tests.contract.test_store_contract import _write
from tests.fixtures.builders import Thread

pytestmark = pytest.mark.anyio


async def test_a_runs_task_budget_is_read_back_with_its_scope_by_every_thread_of_the_run(store: Any) -> None:
    t, plain = Thread(), Thread()
    budget = TaskBudget(total_tokens=50_000, cost=1.5, hard=False)
    first = t.system("Be brief.", key="sys").model_copy(update={"task_budget": budget})
    child = t.child_thread()
    await _write(store, [first, t.user("Fix app.py", key="u1"), child.user("look", key="c1")])
    await _write(store, [plain.system("Be brief.", key="p1")], start_seq=4)

    async with store.connection() as s:
        assert (await s.scope_of(t.thread_id)).task_budget == budget
        assert (await s.scope_of(child.thread_id)).task_budget == budget
        assert (await s.scope_of(plain.thread_id)).task_budget is None
