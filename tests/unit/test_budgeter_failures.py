"""The budgeter never retries for ever what fails for what a thread holds: it passes the thread over
until its next records; an outage is retried."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.exceptions import CtxError, InvalidPolicy, StoreUnavailable
from services.store.memory import MemoryStore
from tests.contract.test_store_contract import _write
from tests.fixtures.builders import Thread
from workers.budgeter import BudgeterWorker
from workers.metrics import FleetMetrics

pytestmark = pytest.mark.anyio


class _Failing:
    """A budget service whose every evaluation fails with ``error``."""

    def __init__(self, error: CtxError) -> None:
        self.error = error
        self.evaluations = 0

    async def evaluate(self, thread_id: str) -> Any:
        self.evaluations += 1
        raise self.error


async def _evaluated(store: MemoryStore, t: Thread) -> tuple[int, int]:
    async with store.connection() as s:
        head = await s.select_head(t.thread_id)
        view = await s.load_view(t.thread_id)
    assert head is not None
    return view.evaluated_revision, head.revision


async def test_budgeter_passes_over_a_thread_whose_evaluation_fails_deterministically() -> None:
    store, t, metrics = MemoryStore(), Thread(), FleetMetrics()
    await _write(store, [t.user("a question", key="u1")])
    worker = BudgeterWorker(_Failing(InvalidPolicy("the pinned policy no longer validates")), store, metrics)  # type: ignore[arg-type]
    await worker._evaluate(t.thread_id)
    evaluated, head = await _evaluated(store, t)
    assert evaluated == head  # the sweep no longer finds it, until its next records
    code = InvalidPolicy.code.value
    assert metrics.registry.get_sample_value("ctx_budgeter_failures_total", {"code": code}) == 1


async def test_budgeter_leaves_a_thread_due_when_its_evaluation_meets_an_outage() -> None:
    store, t = MemoryStore(), Thread()
    await _write(store, [t.user("a question", key="u1")])
    worker = BudgeterWorker(_Failing(StoreUnavailable("connection refused")), store, FleetMetrics())  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):  # to the scheduler, which logs it once; the sweep retries
        await worker._evaluate(t.thread_id)
    evaluated, head = await _evaluated(store, t)
    assert evaluated < head
