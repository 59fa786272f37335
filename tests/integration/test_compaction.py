"""Budgeter and compactor over real NATS and Postgres, with fixed small budgets."""

from __future__ import annotations

from dataclasses import replace

import asyncio
import json

import asyncpg
import pytest

from contracts import CompactionJob, CompactionPolicy, ContextPolicy, PrepareRequest
from ctxfleet_client.client import FleetClient
from services.app.compacting import CompactionService
from services.core.compaction.model import Segment, StructuredSummary, SummarizerFailed
from services.core.compaction.structured import summarize_records
from contracts.exceptions import ContextBudgetExceeded, ThreadNotFound
from services.app.scheduling import request_job
from services.app.views import ViewLoader
from services.store.postgres import PgConnection, PgStore
from services.store.views import _SELECT_VIEW
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def _policy(client: FleetClient, name: str, budget: int, **compaction: object) -> str:
    policy = ContextPolicy(
        name=name,
        model_profile=None,
        budget_tokens=budget,
        compaction=CompactionPolicy.model_validate(compaction),
    )
    await client.register_policy(policy)
    return name


async def _start(client: FleetClient, t: Thread, policy: str) -> None:
    first = t.system("You fix bugs in a Python repository.")
    await client.append(first.model_copy(update={"policy": policy}))


async def _groups(client: FleetClient, t: Thread, n: int, *, words: int = 60, start: int = 0) -> str:
    key = ""
    for i in range(start, start + n):
        await client.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat file{i}.py"}),)))
        key = f"out{i}"
        await client.append(t.outcome(f"c{i}", f"contents of file{i}.py " * words, key=key))
    return key


async def _evaluated(db: asyncpg.Connection, t: Thread) -> bool:
    """Whether the budgeter has evaluated the thread at its head."""
    return bool(
        await db.fetchval(
            "SELECT v.evaluated_revision >= h.revision FROM ctx.thread_heads h "
            "JOIN ctx.thread_views v USING (thread_id) WHERE thread_id = $1",
            t.thread_id,
        )
    )


async def _summaries(client: FleetClient, t: Thread) -> int:
    try:
        return (await client.inspect(t.thread_id, limit=1)).summaries
    except ThreadNotFound:
        return 0


def _request(t: Thread, budget: int, after: str) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=budget,
        after_event_key=after,
    )


async def test_budgeter_compacts_in_the_background_once_the_ratio_is_reached(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await _start(client, t, await _policy(client, "bg", 3_000, keep_recent_groups=1))
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    last = await _groups(client, t, 14)

    async def summarized() -> bool:
        return await _summaries(client, t) >= 1

    await eventually(summarized, what="a background compaction")
    inspection = await client.inspect(t.thread_id, limit=1)
    assert inspection.record_count == 2 + 28  # source records are never deleted or rewritten
    prepared = await client.prepare(_request(t, 3_000, last))
    assert prepared.summary is not None and prepared.budget_report.used.total <= 3_000
    # Stable before volatile: instructions, the run's task, then the summary.
    assert [m.role for m in prepared.messages[:3]] == ["system", "user", "user"]
    assert prepared.messages[1].content == "Fix the failing import in app.py"
    assert prepared.messages[2].content.startswith("[context summary")  # type: ignore[union-attr]
    row = await db.fetchrow(
        "SELECT baseline_model_steps, baseline_watermark FROM ctx.thread_views WHERE thread_id=$1",
        t.thread_id,
    )
    assert row["baseline_model_steps"] > 0 and row["baseline_watermark"] > 0


async def test_turn_trigger_below_target_still_really_reduces_and_moves_the_baseline(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    policy = await _policy(
        client, "turns", 100_000, triggers={"context_ratio": None, "user_turns": 2}, keep_recent_groups=0
    )
    await _start(client, t, policy)
    await client.append(t.user("first question about parser.py"))
    await _groups(client, t, 2)
    await client.append(t.user("second question about render.py"))
    await _groups(client, t, 1, start=5)

    async def committed() -> bool:
        return await _summaries(client, t) == 1

    await eventually(committed, what="a turn-triggered compaction")
    row = await db.fetchrow(
        "SELECT s.tokens_before, s.tokens_after, s.trigger_reasons, v.baseline_user_turns "
        "FROM ctx.summaries s JOIN ctx.thread_views v USING (thread_id) WHERE thread_id=$1",
        t.thread_id,
    )
    assert row["trigger_reasons"] == ["user_turns"] and row["tokens_after"] < row["tokens_before"]
    assert row["baseline_user_turns"] == 2
    await client.append(t.user("third question", key="q3"))
    # One more question is below the period: once the budgeter has evaluated it, still one summary.
    await eventually(lambda: _evaluated(db, t), what="the budgeter's pass over the third question")
    assert (await client.inspect(t.thread_id, limit=1)).summaries == 1


class _Queue:
    def __init__(self) -> None:
        self.jobs: list[CompactionJob] = []

    async def publish(self, job: CompactionJob) -> None:
        self.jobs.append(job)


async def _job(
    pool: asyncpg.Pool, thread_id: str, reasons: tuple[str, ...] = ("context_ratio",)
) -> CompactionJob:
    queue = _Queue()
    async with pool.acquire() as conn:
        view = await ViewLoader().load(PgConnection(conn), thread_id)
        await conn.execute(
            "UPDATE ctx.thread_views SET pending_fingerprint = NULL WHERE thread_id = $1", thread_id
        )
        job = await request_job(PgConnection(conn), queue, view, reasons)
    assert job is not None
    return job


@pytest.fixture
async def quiet_fleet(start_fleet):  # type: ignore[no-untyped-def]
    """Recorder and assembler only: jobs are run by the test itself."""
    return await start_fleet(workers="recorder,assembler")


async def _thread_with_history(
    client: FleetClient, db: asyncpg.Connection, policy: str, groups: int = 6
) -> tuple[Thread, str]:
    t = Thread()
    await _start(client, t, policy)
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    last = await _groups(client, t, groups)

    async def recorded() -> bool:
        return (
            int(await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id=$1", t.thread_id))
            == 2 + 2 * groups
        )

    await eventually(recorded, what="the history")
    return t, last


class _Failing:
    name = "failing"

    async def summarize(self, segment: Segment) -> StructuredSummary:
        raise SummarizerFailed("malformed", "not JSON")


async def test_failed_summary_never_moves_the_baseline_and_throttles(
    quiet_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, _ = await _thread_with_history(client, db, await _policy(client, "f", 2_000))
    pool = quiet_fleet.pool
    service = CompactionService(PgStore(pool), ViewLoader(), lambda request: _Failing())
    outcome = await service.run(await _job(pool, t.thread_id))
    assert (outcome.status, outcome.stage) == ("failed", "malformed")
    row = await db.fetchrow("SELECT * FROM ctx.thread_views WHERE thread_id=$1", t.thread_id)
    assert (row["view_revision"], row["baseline_model_steps"], row["failures"]) == (0, 0, 1)
    assert row["throttle"] is not None and row["pending_fingerprint"] is None
    assert await db.fetchval("SELECT count(*) FROM ctx.summaries") == 0


async def test_two_compactors_racing_on_one_thread_commit_exactly_one_summary(
    quiet_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, _ = await _thread_with_history(client, db, await _policy(client, "race", 2_000))
    pool = quiet_fleet.pool
    job = await _job(pool, t.thread_id)
    a = CompactionService(PgStore(pool), ViewLoader())
    b = CompactionService(PgStore(pool), ViewLoader())
    outcomes = await asyncio.gather(a.run(job), b.run(job))
    assert sorted(o.status for o in outcomes) in (["committed", "dropped"], ["committed", "stale"])
    assert await db.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id=$1", t.thread_id) == 1
    assert (
        await db.fetchval("SELECT view_revision FROM ctx.thread_views WHERE thread_id=$1", t.thread_id) == 1
    )


class _Slow:
    """Summarizes normally, but lets the test record a user message while the summary is being built."""

    name = "slow"

    def __init__(self, during: asyncio.Event, proceed: asyncio.Event) -> None:
        self.during, self.proceed = during, proceed

    async def summarize(self, segment: Segment) -> StructuredSummary:
        self.during.set()
        await self.proceed.wait()
        return summarize_records(segment.records)


async def test_user_message_arriving_while_a_compaction_commits_is_kept_after_the_summary(
    quiet_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, _ = await _thread_with_history(client, db, await _policy(client, "mid", 2_000))
    pool = quiet_fleet.pool
    during, proceed = asyncio.Event(), asyncio.Event()
    service = CompactionService(PgStore(pool), ViewLoader(), lambda request: _Slow(during, proceed))
    run = asyncio.create_task(service.run(await _job(pool, t.thread_id)))
    await during.wait()
    await client.append(t.user("Also keep the old CLI flag working.", key="late"))
    await client.prepare(_request(t, 100_000, "late"))
    proceed.set()
    assert (await run).status == "committed"
    # Under the policy's budget, which the summary was made for (a larger one shows the records).
    prepared = await client.prepare(_request(t, 2_000, "late"))
    assert (
        prepared.summary is not None
        and prepared.messages[-1].content == "Also keep the old CLI flag working."
    )
    assert prepared.summary.covered_to < prepared.source_watermark.thread_seq


async def test_required_content_at_82_percent_does_not_summarize_every_loop(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    budget = 2_000
    await client.register_policy(ContextPolicy(name="heavy", model_profile=None, budget_tokens=budget))
    system = t.system("Follow the release checklist exactly. " * 205)  # about 82% of the budget
    await client.append(system.model_copy(update={"policy": "heavy"}))
    await client.append(t.user("Ship it", key="task"))
    for i in range(12):
        await client.append(t.assistant(f"ok {i}", key=f"a{i}"))

        await eventually(lambda: _evaluated(db, t), what=f"evaluation after loop {i}")
    row = await db.fetchrow("SELECT attempts, failures FROM ctx.thread_views WHERE thread_id=$1", t.thread_id)
    summaries = await db.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id=$1", t.thread_id)
    # Twelve loops over the trigger; at most one real attempt, then it waits for 5% growth.
    assert summaries + row["failures"] <= 1, (summaries, row["attempts"], row["failures"])


async def test_huge_system_prompt_is_refused_with_itemized_sizes(fleet, client: FleetClient) -> None:
    t = Thread()
    await client.append(t.system("rule " * 3_000))
    await client.append(t.user("hi", key="k"))
    with pytest.raises(ContextBudgetExceeded) as err:
        await client.prepare(_request(t, 1_000, "k"))
    items = {i["block_id"]: i["tokens"] for i in err.value.details["items"]}  # type: ignore[union-attr]
    assert items["instruction:1"] > 1_000


async def test_single_group_larger_than_the_budget_is_cut_to_head_and_tail_not_dropped(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.system("Short rules."))
    await client.append(t.user("Summarize the logs", key="task"))
    await client.append(t.assistant(calls=(("big", "bash", {"cmd": "cat build.log"}),)))
    await client.append(
        t.outcome("big", "\n".join(f"line {i}: compiler warning W{i:04d}" for i in range(400)), key="o")
    )
    await client.append(t.assistant("Most warnings are W0001-style.", key="after"))
    await client.append(t.user("And the errors?", key="q2"))
    prepared = await client.prepare(_request(t, 900, "q2"))
    assert prepared.budget_report.used.total <= 900
    # The newest tool group is the model's last action: never summarized away, never dropped —
    # its output is cut to head + tail with where to read the rest, and the reply after it stays.
    assert prepared.omitted == () and prepared.compaction_wait_ms == 0
    assert prepared.budget_report.reductions.trimmed == 1
    tool = next(m for m in prepared.messages if m.role == "tool")
    assert "line 0: compiler warning W0000" in str(tool.content) and "ctx://blob/" in str(tool.content)
    assert [m.content for m in prepared.messages[-2:]] == [
        "Most warnings are W0001-style.",
        "And the errors?",
    ]


async def test_replayed_event_and_completion_check_do_not_count_twice(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    step = t.assistant("step", key="s1")
    await client.append(t.user("go", key="q"))
    await client.append(step)
    await client.append_raw(t.thread_id, "retry", step.model_dump_json().encode())
    check = t.assistant("done?", key="check")
    await client.append(
        check.model_copy(update={"payload": check.payload.model_copy(update={"purpose": "completion"})})
    )
    await client.prepare(_request(t, 10_000, "check"))
    row = await db.fetchrow(
        "SELECT user_turns, model_steps FROM ctx.thread_heads WHERE thread_id=$1", t.thread_id
    )
    assert (row["user_turns"], row["model_steps"]) == (1, 1)


async def test_a_session_keeps_the_policy_revision_it_started_with(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    first = await client.register_policy(
        ContextPolicy(name="pinned", model_profile=None, budget_tokens=50_000)
    )
    old, new = Thread(), Thread()
    await client.append(old.system("s").model_copy(update={"policy": "pinned"}))
    await client.append(old.user("q", key="k"))
    await client.prepare(_request(old, 1_000, "k"))
    second = await client.register_policy(
        ContextPolicy(name="pinned", model_profile=None, budget_tokens=8_000)
    )
    await client.append(new.system("s").model_copy(update={"policy": "pinned"}))
    await client.append(new.user("q", key="k"))
    await client.prepare(_request(new, 1_000, "k"))
    await client.append(old.user("later", key="k2"))
    await client.prepare(_request(old, 1_000, "k2"))
    rows = dict(
        await db.fetch(
            "SELECT session_id, policy_revision FROM ctx.sessions WHERE session_id = ANY($1)",
            [old.session_id, new.session_id],
        )
    )
    assert (first.revision, second.revision) == (1, 2)
    assert rows == {old.session_id: 1, new.session_id: 2}


async def test_an_unknown_policy_on_a_sessions_first_event_is_dead_lettered(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await client.append(t.user("q").model_copy(update={"policy": "no-such-policy"}))

    async def rejected() -> bool:
        return (
            await db.fetchval("SELECT count(*) FROM ctx.dead_letters WHERE thread_id = $1", t.thread_id) > 0
        )

    await eventually(rejected, what="the unknown_policy dead letter")
    letter = await db.fetchrow("SELECT code, reason FROM ctx.dead_letters WHERE thread_id = $1", t.thread_id)
    assert letter["code"] == "unknown_policy" and "no-such-policy" in letter["reason"]
    assert await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id = $1", t.thread_id) == 0
    assert await db.fetchval("SELECT count(*) FROM ctx.sessions WHERE session_id = $1", t.session_id) == 0


async def test_registering_an_invalid_policy_is_refused_with_a_typed_error(
    fleet, client: FleetClient, nats_url: str
) -> None:
    import nats as nats_client

    nc = await nats_client.connect(nats_url)
    try:
        bad = {
            "name": "bad",
            "budget_tokens": 1000,
            "model_profile": None,
            "compaction": {"triggers": {"context_ratio": 0.5}, "target_context_ratio": 0.7},
        }
        reply = await nc.request("ctx.policy.register.default", json.dumps(bad).encode(), timeout=5)
        assert b'"code":"invalid_policy"' in reply.data and b"must be below" in reply.data
    finally:
        await nc.close()


async def test_an_urgent_compaction_keeps_the_newest_tool_group_in_view(
    quiet_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, _ = await _thread_with_history(client, db, await _policy(client, "urgent-keep", 100_000), groups=8)
    pool = quiet_fleet.pool
    queue = _Queue()
    async with pool.acquire() as conn:
        view = await ViewLoader().load(PgConnection(conn), t.thread_id)
        job = await request_job(
            PgConnection(conn), queue, view, ("hard_budget",), urgent=True, input_budget=900
        )
    assert job is not None
    outcome = await CompactionService(PgStore(pool), ViewLoader()).run(job)
    assert outcome.status == "committed", outcome
    prepared = await client.prepare(_request(t, 900, "out7"))
    tool_messages = [m for m in prepared.messages if m.role == "tool"]
    assert tool_messages and tool_messages[-1].tool_call_id == "c7"
    assert prepared.summary is not None and prepared.summary.covered_to < prepared.source_watermark.thread_seq


async def test_summary_stays_within_its_share_however_long_the_thread(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    budget = 3_000
    t = Thread()
    await _start(client, t, await _policy(client, "converge", budget, keep_recent_groups=1))
    await client.append(t.user("Fix the failing import in app.py; never touch setup.py", key="task"))
    last = ""
    for chunk in range(6):
        last = await _groups(client, t, 10, words=40, start=chunk * 10)
        prepared = await client.prepare(_request(t, budget, last))
        assert prepared.budget_report.used.total <= budget
        assert [m for m in prepared.messages if m.role == "tool"], "the newest tool result is always in view"

    async def compacted_often() -> bool:
        return (
            int(await db.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id=$1", t.thread_id)) >= 3
        )

    await eventually(compacted_often, timeout=20, what="several compactions")
    share = int(CompactionPolicy().summary_ratio * budget)
    rows = await db.fetch(
        "SELECT tokens_o200k FROM ctx.summaries WHERE thread_id=$1 ORDER BY view_revision", t.thread_id
    )
    assert max(r["tokens_o200k"] for r in rows) <= share, [r["tokens_o200k"] for r in rows]
    final = await client.prepare(_request(t, budget, last))
    text = "\n".join(str(m.content) for m in final.messages)
    assert "never touch setup.py" in text


async def test_a_store_reads_a_committed_summary_once_and_a_newer_one_when_the_view_moves_on(
    quiet_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, _ = await _thread_with_history(client, db, await _policy(client, "held", 2_000), groups=8)
    pool = quiet_fleet.pool
    assert (
        await CompactionService(PgStore(pool), ViewLoader()).run(await _job(pool, t.thread_id))
    ).status == ("committed")
    store = PgStore(pool)
    async with store.connection() as s:
        first = (await s.load_view(t.thread_id)).summary
    async with store.connection() as s:
        again = (await s.load_view(t.thread_id)).summary
    async with PgStore(pool).connection() as other:
        fresh = (await other.load_view(t.thread_id)).summary
    assert first is not None and again is first  # held by this store: its body was not read again
    async with store.connection() as s:
        at_head = await s.thread_at_head(t.thread_id)
        assert at_head is not None and at_head.state.summary is first
        apart = await s.load_view(t.thread_id)
        assert replace(at_head.state, pending_age_s=None) == replace(apart, pending_age_s=None)
        assert at_head.window is None
        assert (at_head.head, at_head.scope) == (
            await s.select_head(t.thread_id),
            await s.scope_of(t.thread_id),
        )
    assert fresh is not None and fresh is not first and fresh == first
    held = await db.fetchrow("SELECT summary_id FROM ctx.thread_views WHERE thread_id = $1", t.thread_id)
    # What the store asks when it holds the view's summary: everything but its body and text.
    async with store.connection() as s:
        row = await s._conn.fetchrow(_SELECT_VIEW, t.thread_id, held["summary_id"])
    assert row["summary_held"] and row["summary_body"] is None and row["summary_text"] is None

    await _groups(client, t, 6, start=8)

    async def grown() -> bool:
        count = await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id=$1", t.thread_id)
        return int(count) == 2 + 2 * 14

    await eventually(grown, what="more history")
    assert (await CompactionService(store, ViewLoader()).run(await _job(pool, t.thread_id))).status == (
        "committed"
    )
    async with store.connection() as s:
        newer = (await s.load_view(t.thread_id)).summary
    assert newer is not None and newer.summary_id != first.summary_id
    assert newer.body.model_dump() != first.body.model_dump()


async def test_a_compaction_the_cache_trigger_started_covers_all_a_ratio_compaction_leaves_above_target(
    quiet_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    # 8 groups of ~400 tokens under a 10k budget: the ratio's 5k target is met after one group.
    policy = await _policy(client, "cover", 10_000)
    pool = quiet_fleet.pool
    covered = {}
    for reasons in (("context_ratio",), ("context_ratio", "cache")):
        t, _ = await _thread_with_history(client, db, policy, groups=8)
        outcome = await CompactionService(PgStore(pool), ViewLoader()).run(
            await _job(pool, t.thread_id, reasons)
        )
        assert outcome.status == "committed"
        covered[reasons] = await db.fetchval(
            "SELECT covered_to FROM ctx.thread_views WHERE thread_id=$1", t.thread_id
        )
    # The ratio's compaction stops at its target; the cache's covers every group it may.
    assert covered[("context_ratio",)] < covered[("context_ratio", "cache")]
