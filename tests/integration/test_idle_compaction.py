"""The budgeter's idle check: a thread idle past its provider's cache TTL is compacted off the hot path."""

from __future__ import annotations

import asyncpg
import pytest

from contracts import CompactionJob, CompactionPolicy, ContextPolicy
from ctxfleet_client.client import FleetClient
from services.app.budgeting import BudgetService
from services.app.compacting import CompactionService
from services.app.scheduling import cache_ttl_for
from services.app.views import ViewLoader
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually
from workers.budgeter import BudgeterWorker
from workers.metrics import FleetMetrics

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


class _Jobs:
    def __init__(self) -> None:
        self.published: list[CompactionJob] = []

    async def publish(self, job: CompactionJob) -> None:
        self.published.append(job)


class _SweptStore(PgStore):
    """The store, counting the budgeter's sweeps: a test waits for sweeps, not for time."""

    sweeps = 0

    async def stale_views(self, limit: int) -> list[str]:
        self.sweeps += 1
        return await super().stale_views(limit)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def quiet_fleet(start_fleet):  # type: ignore[no-untyped-def]
    """Recorder and assembler only: the test runs its own budgeter, on its own clock."""
    return await start_fleet(workers="recorder,assembler")


async def _thread(client: FleetClient, db: asyncpg.Connection, groups: int = 12) -> Thread:
    # Neither the ratio nor the cache trigger: only the idle check compacts this thread, whose
    # history outgrows the summary that would replace it (a quarter of the budget).
    policy = ContextPolicy(
        name="idle",
        model_profile=None,
        budget_tokens=8_000,
        compaction=CompactionPolicy.model_validate(
            {"triggers": {"context_ratio": None, "user_turns": 100}, "keep_recent_groups": 1}
        ),
    )
    await client.register_policy(policy)
    t = Thread()
    await client.append(
        t.system("You fix bugs in a Python repository.").model_copy(update={"policy": "idle"})
    )
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    for i in range(groups):
        await client.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat file{i}.py"}),)))
        await client.append(t.outcome(f"c{i}", f"contents of file{i}.py " * 60, key=f"out{i}"))

    async def recorded() -> bool:
        count = await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id=$1", t.thread_id)
        return int(count) == 2 + 2 * groups

    await eventually(recorded, what="the history")
    return t


async def test_an_idle_thread_is_compacted_once_and_not_again_while_nothing_changes(
    quiet_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = await _thread(client, db)
    clock, jobs = _Clock(), _Jobs()
    store = _SweptStore(quiet_fleet.pool)
    worker = BudgeterWorker(BudgetService(store, ViewLoader(), jobs), store, FleetMetrics(), clock=clock)
    await worker.start()
    try:

        async def evaluated() -> bool:
            return bool(
                await db.fetchval(
                    "SELECT v.evaluated_revision >= h.revision FROM ctx.thread_heads h "
                    "JOIN ctx.thread_views v USING (thread_id) WHERE thread_id = $1",
                    t.thread_id,
                )
            )

        worker.schedule(t.thread_id)
        await eventually(evaluated, what="the budgeter's evaluation")
        assert jobs.published == []  # no trigger of the policy fires

        clock.now = cache_ttl_for("budget:8000") + 1

        async def idle_job() -> bool:
            return len(jobs.published) == 1

        await eventually(idle_job, what="a compaction of the idle thread", timeout=30)
        job = jobs.published[0]
        assert job.reasons == ("idle",)
        outcome = await CompactionService(store, ViewLoader()).run(job)
        assert outcome.status == "committed"
        assert (await client.inspect(t.thread_id, limit=1)).summaries == 1

        clock.now += 10 * cache_ttl_for("budget:8000")
        swept = store.sweeps

        async def two_more_sweeps() -> bool:
            return store.sweeps >= swept + 2

        await eventually(two_more_sweeps, what="two more sweeps of the budgeter", timeout=30)
        assert len(jobs.published) == 1
    finally:
        await worker.stop()
