"""The console's listings (``ListingStore``), alike on the in-memory store and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from services.core.ledger import decode_batch, plan_batch
from services.core.ledger import batch_keys
from services.store.listing import CompactionEntry, SessionListing, ToolCallEntry
from tests.contract.test_store_contract import COUNTERS, LIMITS, Store, _summary
from tests.fixtures.builders import Thread, incoming

pytestmark = pytest.mark.anyio


async def _write(s: Store, events: list[Any], *, tenant: str = "default", start_seq: int = 1) -> None:
    async with s.connection() as session:
        decoded = decode_batch(incoming(events, start_seq=start_seq, tenant=tenant), LIMITS)
        plan = plan_batch(decoded, await session.read_for_batch(batch_keys(decoded)), LIMITS, COUNTERS)
        async with session.transaction():
            await session.write_plan(plan, recorded_by="contract", keep_raw=1024)


async def test_sessions_are_listed_newest_first_with_their_tenant_and_counts(store: Store) -> None:
    first, second, other = Thread(), Thread(), Thread()
    await _write(store, [first.user("one", key="k1")], tenant="acme")
    await _write(store, [second.user("two", key="k1")], tenant="acme")
    await _write(store, [second.child_thread().user("child", key="c1")], tenant="acme")
    await _write(store, [other.user("three", key="k1")], tenant="globex")

    acme = await store.list_sessions("acme", 10)
    assert [s.session_id for s in acme] == [second.session_id, first.session_id]
    assert acme[0] == SessionListing(
        tenant="acme",
        session_id=second.session_id,
        principal_id=None,
        agent_release=None,
        policy="default@1",
        last_seq=2,
        runs=1,
        threads=2,
    )
    everyone = await store.list_sessions(None, 10)
    assert [(s.tenant, s.session_id) for s in everyone] == [
        ("globex", other.session_id),
        ("acme", second.session_id),
        ("acme", first.session_id),
    ]
    assert [s.session_id for s in await store.list_sessions(None, 1)] == [other.session_id]
    assert await store.list_sessions("nobody", 10) == []


async def test_a_threads_tool_calls_are_listed_in_call_order_with_their_outcomes(store: Store) -> None:
    t = Thread()
    await _write(
        store,
        [
            t.user("fix it", key="u1"),
            t.assistant(calls=(("c2", "bash", {"cmd": "ls"}), ("c1", "read", {"path": "a"})), key="a1"),
            t.outcome("c2", "a.py", status="error", key="o1"),
        ],
    )
    assert await store.thread_tool_calls(t.thread_id) == [
        ToolCallEntry("c1", "read", 2, None, None),
        ToolCallEntry("c2", "bash", 2, 3, "error"),
    ]
    assert await store.thread_tool_calls("nothing.here") == []


async def test_a_threads_compactions_are_listed_with_tokens_before_and_after(store: Store) -> None:
    t = Thread()
    await _write(store, [t.user("one", key="k1"), t.user("two", key="k2")])
    assert await store.thread_compactions(t.thread_id) == []
    async with store.connection() as s:
        await s.ensure_view(t.thread_id)
        summary_id = await s.commit_summary(0, _summary(t.thread_id, 2))
    assert await store.thread_compactions(t.thread_id) == [
        CompactionEntry(
            view_revision=1,
            covered_from=1,
            covered_to=2,
            tokens_before=100,
            tokens_after=10,
            summarizer="contract",
            trigger_reasons=("context_ratio",),
            target_reached=True,
            summary_id=str(summary_id),
            text=_summary(t.thread_id, 2).text,
        )
    ]
