"""Window rollover over real NATS and Postgres: a rollover-policy thread past RED closes
its window with a handoff and is served from state, not from the old window's history."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import asyncpg
import pytest

from contracts import (
    ContextPolicy,
    PhaseChangeEvent,
    PhaseChangePayload,
    PathRule,
    PreparedContext,
    PrepareRequest,
    ToolCatalog,
    ToolEffect,
    ToolSchema,
    ToolSpec,
)
from contracts.windows import RolloverTrigger, WindowPolicy, WindowStrategy
from ctxfleet_client.client import FleetClient
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

CATALOG = ToolCatalog(
    release="yard@1",
    paths=(PathRule(pattern="item:{id}.location", kind="business_fact"),),
    tools=(
        ToolSpec(
            name="move_item",
            reads=("item:{id}.location",),
            effects=(ToolEffect(path="item:{args.item_id}.location", value="{result.location}"),),
        ),
        ToolSpec(name="count_stock"),
    ),
)
# 1,500 tokens: fourteen counting groups of ~150 tokens each take the window well past its red line.
BUDGET = 1_500


async def _prepare(client: FleetClient, t: Thread, after: str) -> PreparedContext:
    return await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            budget_tokens=BUDGET,
            after_event_key=after,
            tools=(ToolSchema(name="move_item"),),
        )
    )


async def _recorded(db: asyncpg.Connection, event_key: str) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM ctx.records WHERE event_key = $1", event_key))


async def _move(client: FleetClient, t: Thread, n: int, location: str) -> str:
    await client.append(t.assistant(f"moving item 7 ({n})", calls=((f"m{n}", "move_item", {"item_id": 7}),)))
    await client.append(t.outcome(f"m{n}", f'{{"location": "{location}"}}', key=f"moved{n}"))
    return f"moved{n}"


async def test_rollover_thread_past_red_is_served_from_window_2_with_handoff_not_old_history(
    start_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    fleet = await start_fleet()
    await client.register_catalog(CATALOG)
    await client.register_policy(
        ContextPolicy(
            name="roll",
            model_profile=None,
            budget_tokens=BUDGET,
            window=WindowPolicy(strategy=WindowStrategy.ROLLOVER),
        )
    )
    t = Thread()
    await client.append(
        t.system("You run the yard.").model_copy(update={"agent_release": "yard@1", "policy": "roll"})
    )
    await client.append(t.user("Where does item 7 end up?", key="task"))
    await _move(client, t, 1, "dock_A")
    for n in range(14):
        await client.append(
            t.assistant(
                "counting the yard " + "row by row, slowly " * 12, calls=((f"c{n}", "count_stock", {}),)
            )
        )
        await client.append(t.outcome(f"c{n}", "row clear " * 30))
    last = await _move(client, t, 2, "dock_B")
    await eventually(
        lambda: _recorded(db, last), what="the last event recorded (showing the context names none)"
    )

    # Shown, the context says the rollover its prepare would make, and makes none.
    shown = await client.show_context(t.thread_id)
    assert shown.runtime_would == (
        "close this window (hard_limit) and answer from the next one; shown: this window's context, as "
        "far as it fits",
    )
    assert shown.prepared.window == 1 and shown.budget_source == "the session's policy roll@1"
    assert await db.fetchval("SELECT count(*) FROM ctx.windows WHERE thread_id = $1", t.thread_id) == 0

    rolled = await _prepare(client, t, last)

    texts = "\n".join(m.content or "" for m in rolled.messages)
    assert rolled.window == 2 and rolled.handoff_id is not None
    assert rolled.rollover is not None and rolled.rollover.trigger is RolloverTrigger.HARD_LIMIT
    assert rolled.rollover.handoff_tokens > 0
    assert "counting the yard" not in texts and "row clear" not in texts  # the closed window's history
    assert "Where does item 7 end up?" in texts  # the run's task, from its own record
    assert 'item:7.location = "dock_B" (CURRENT' in texts
    assert 'item:7.location = "dock_A"' not in texts
    assert rolled.budget_report.used.total < BUDGET * 0.6
    handoffs = await db.fetch(
        "SELECT h.handoff_id::text AS id, w.window_no FROM ctx.window_handoffs h JOIN ctx.windows w "
        "USING (handoff_id) WHERE h.thread_id = $1",
        t.thread_id,
    )
    assert [(r["id"], r["window_no"]) for r in handoffs] == [(rolled.handoff_id, 2)]
    # A view load reads head, scope, state and the open window in one statement: the same as apart.
    async with PgStore(fleet.pool).connection() as store:
        at_head = await store.thread_at_head(t.thread_id)
        assert at_head is not None
        assert at_head.window == await store.current_window(t.thread_id) and at_head.window is not None
        assert at_head.head == await store.select_head(t.thread_id)
        assert at_head.scope == await store.scope_of(t.thread_id)
        # The age of a pending job is measured at each read; the fleet's budgeter may mark the view
        # evaluated at any moment, so compare a read taken between two reads that agree.
        for _ in range(50):
            before = await store.load_view(t.thread_id)
            state = await store.thread_at_head(t.thread_id)
            after = await store.load_view(t.thread_id)
            if replace(before, pending_age_s=None) == replace(after, pending_age_s=None):
                break
            await asyncio.sleep(0.05)
        assert state is not None
        assert replace(state.state, pending_age_s=None) == replace(after, pending_age_s=None)
        assert await store.thread_at_head("nobody.main") is None
    # Rollover, not summary: the budgeter never compacted this thread.
    assert await db.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id = $1", t.thread_id) == 0

    await client.append(t.user("And is dock_B full?", key="q2"))
    again = await _prepare(client, t, "q2")
    assert (again.window, again.handoff_id, again.rollover) == (2, rolled.handoff_id, None)
    assert "And is dock_B full?" in "\n".join(m.content or "" for m in again.messages)
    # The old window stays in the ledger, readable, and each record names its window.
    inspection = await client.inspect(t.thread_id, limit=200)
    assert inspection.record_count >= 33 and inspection.window == 2
    windows = {r.event_key: r.window for r in inspection.records}
    assert (windows["task"], windows[last], windows["q2"]) == (1, 1, 2)


async def test_runtime_phase_change_rolls_a_green_window_over_at_a_safe_boundary(
    start_fleet, client: FleetClient
) -> None:
    await start_fleet()
    await client.register_catalog(CATALOG)
    await client.register_policy(
        ContextPolicy(
            name="phases",
            model_profile=None,
            budget_tokens=20_000,
            window=WindowPolicy(strategy=WindowStrategy.ROLLOVER),
        )
    )
    t = Thread()
    await client.append(
        t.system("You run the yard.").model_copy(update={"agent_release": "yard@1", "policy": "phases"})
    )
    await client.append(t.user("Survey the yard, then move item 7.", key="task"))
    await client.append(_phase_change(t, "survey", "p1"))
    await client.append(t.assistant("surveying row 1", calls=(("s1", "count_stock", {}),)))
    await client.append(t.outcome("s1", "row 1 clear", key="o-s1"))
    first = await _prepare(client, t, "o-s1")
    assert (first.window, first.rollover) == (1, None)  # green, one phase so far

    await client.append(_phase_change(t, "moving", "p2"))
    rolled = await _prepare(client, t, "p2")
    assert rolled.window == 2
    assert rolled.rollover is not None and rolled.rollover.trigger is RolloverTrigger.PHASE_BOUNDARY
    assert "surveying row 1" not in "\n".join(m.content or "" for m in rolled.messages)


def _phase_change(t: Thread, phase: str, key: str) -> PhaseChangeEvent:
    return PhaseChangeEvent(
        payload=PhaseChangePayload(phase=phase, expected_steps=5),
        event_key=key,
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id="main",
    )
