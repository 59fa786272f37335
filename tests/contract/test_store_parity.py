"""The same events recorded into the in-memory store and into PostgreSQL read back identically.

Real traces (bundled samples) and a hand-built session with child threads, exports, resets, runs,
duplicates and rejections go through the real recording service into both stores; everything a
view load, a prepare and an inspection can read is then compared thread by thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from contracts.task_budgets import TaskBudget
from contracts import DeadLetter
from contracts.subjects import DEFAULT_TENANT
from services.core.ledger import RecordingLimits
from services.app.recording import RecordingService
from services.edge.replay import ReplayOptions, trace_events
from services.store.memory import MemoryStore
from services.store.postgres import PgStore
from services.core.trace import read_trace
from services.app.views import ViewLoader
from tests.fixtures.builders import Thread, incoming

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

SAMPLES = Path(__file__).resolve().parents[2] / "infra" / "samples"


class _Sink:
    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        pass


def _hand_built() -> list[Any]:
    a = Thread()
    child = a.child_thread()
    b = a.next_run()
    return [
        a.system("You fix bugs.", key="sys"),
        a.user("Fix app.py", key="task"),
        a.assistant("delegating", calls=(("c1", "spawn", {"task": "read app.py"}),), key="a1"),
        child.user("read app.py", key="ch-task"),
        child.export([(a.thread_id, 2)], note="the task", key="ch-export"),
        child.assistant("done reading", key="ch-a1"),
        a.child("app.py imports a missing module", key="a-child"),
        a.outcome("c1", "child finished", key="o1"),
        a.outcome("c-none", "orphan", key="o-orphan"),
        a.user("Fix app.py", key="task"),  # redelivered: a duplicate
        a.run_status("completed", key="a-end"),
        b.user("And the tests?", key="b1").model_copy(
            update={"client_ts": datetime(2024, 5, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))}
        ),
        b.assistant("checking", key="b2"),
        b.reset(key="b-reset"),
        b.user("Start over", key="b3"),
    ]


def _streams() -> list[list[Any]]:
    traces = [
        trace_events(read_trace(SAMPLES / name), ReplayOptions(session_id=f"s-{i}"))
        for i, name in enumerate(
            (
                "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl",
                "tau-bench__gpt-4o-airline_task002_trial1.jsonl",
            )
        )
    ]
    # One run declares its task budget on its first event: kept with the run alike by both stores.
    budget = TaskBudget(total_tokens=200_000, runtime_seconds=3_600, cost=2.5, hard=False)
    traces[1][0] = traces[1][0].model_copy(update={"task_budget": budget})
    return [*traces, _hand_built()]


async def _record(store: Any, events: list[Any], start_seq: int) -> None:
    service = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="parity")
    messages = incoming(events, start_seq=start_seq)
    for i in range(0, len(messages), 40):
        await service.record_batch(0, messages[i : i + 40])


async def _observe(store: Any, thread_ids: list[str], session_ids: list[str]) -> dict[str, Any]:
    loader = ViewLoader()
    seen: dict[str, Any] = {}
    async with store.connection() as s:
        for tid in thread_ids:
            head = await s.select_head(tid)
            assert head is not None, tid
            view = await loader.load(s, tid)
            seen[tid] = {
                "head": asdict(head),
                "scope": asdict(await s.scope_of(tid)),
                # recorded_at is each store's clock: only that both keep one is compared.
                "records": [
                    {**asdict(r), "recorded_at": isinstance(r.recorded_at, datetime)} for r in view.records
                ],
                "view": asdict(view.state),
                "policy": (view.policy_name, view.policy_revision),
                "facts": view.facts,
                "links": await s.select_links(tid),
                "tail": await s.select_tail(tid, limit=5, preview_chars=40),
                "full": await s.select_full(tid),
                "open": await s.open_call_ids(tid),
                "totals": await s.totals(tid),
                "dead": await s.count_dead_letters(tid),
                "orphan": (await s.find_event_outcome(DEFAULT_TENANT, tid, "o-orphan")).rejected,
            }
        for sid in session_ids:
            seen[sid] = (await s.session_policy(sid), await s.read_session_catalog(sid))
    return seen


@pytest.fixture
async def pg(database_url: str) -> AsyncIterator[PgStore]:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        yield PgStore(pool)
    finally:
        await pool.close()


async def test_the_same_events_read_back_identically_from_memory_and_postgres(pg: PgStore) -> None:
    memory = MemoryStore()
    streams = _streams()
    start = 1
    for events in streams:  # one partition: stream sequences keep growing across the streams
        await _record(memory, events, start)
        await _record(pg, events, start)
        start += len(events)
    thread_ids = sorted({e.thread_id for events in streams for e in events})
    session_ids = sorted({e.session_id for events in streams for e in events})
    expected = await _observe(pg, thread_ids, session_ids)
    got = await _observe(memory, thread_ids, session_ids)
    for key in expected:
        assert got[key] == expected[key], key
    assert any(v["orphan"] for k, v in expected.items() if k in thread_ids)  # the scenario did reject one
    assert sum(v["scope"]["task_budget"] is not None for k, v in expected.items() if k in thread_ids) == 1
