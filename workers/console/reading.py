"""What each console page shows, read through the app services and the store ports the process has.

Nothing here writes a record or a view: a prepared context is prepared the way the assembler would,
at the session's policy budget, but with no compaction queue and no wait, so looking at a thread
never asks the compactor for work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from contracts import (
    InspectRequest,
    PreparedContext,
    PrepareRequest,
    SearchReply,
    SearchRequest,
    SessionInspection,
    ThreadInspection,
)
from contracts.ids import split_thread_id
from contracts.subjects import DEFAULT_TENANT
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.searching import search
from services.app.sessions import inspect_session
from services.core.state import Fact
from services.errors import InvalidPolicy, ThreadNotFound
from services.store.listing import CompactionEntry, SessionListing, ToolCallEntry
from services.store.ports import ListingStore, PrepareStore, QueryStore

__all__ = [
    "ConsoleStore",
    "ContextPage",
    "ThreadPage",
    "TimelineRecord",
    "prepare_context",
    "read_search",
    "read_session",
    "read_sessions",
    "read_thread",
]

# A timeline shows this many of the newest records (inspect's own cap is 10 000).
_TIMELINE_RECORDS = 500
_SESSIONS_SHOWN = 200
_SEARCH_HITS = 50


class ConsoleStore(PrepareStore, QueryStore, ListingStore, Protocol):
    """Every port a console page reads through (``PgStore`` has them all)."""


@dataclass(frozen=True, slots=True)
class TimelineRecord:
    """One record of a thread with the tool calls it made or answered."""

    seq: int
    kind: str
    event_key: str
    tokens: int
    preview: str
    calls: tuple[ToolCallEntry, ...]
    outcomes: tuple[ToolCallEntry, ...]


@dataclass(frozen=True, slots=True)
class ThreadPage:
    """A thread's timeline: records (newest last), compactions, refusals and state facts."""

    tenant: str
    inspection: ThreadInspection
    records: tuple[TimelineRecord, ...]
    # After which record each compaction is drawn (its ``covered_to``), in view order.
    compactions: tuple[CompactionEntry, ...]
    facts: tuple[Fact, ...]


@dataclass(frozen=True, slots=True)
class ContextPage:
    """A prepared context, and the budget it was prepared at."""

    tenant: str
    thread_id: str
    policy: str
    prepared: PreparedContext
    # What no block carries: the tool schemas and the per-request priming, so the bars add up to ``used``.
    overhead: int


async def read_sessions(store: ListingStore, tenant: str | None) -> list[SessionListing]:
    """The newest sessions, of ``tenant`` or of every tenant."""
    return await store.list_sessions(tenant, _SESSIONS_SHOWN)


async def read_session(store: ConsoleStore, tenant: str, session_id: str) -> SessionInspection:
    """A session's runs and threads (``ThreadNotFound`` when ``tenant`` has no such session)."""
    return await inspect_session(store, tenant, session_id)


async def read_search(store: ConsoleStore, tenant: str, session_id: str, query: str) -> SearchReply:
    """The best hits of ``query`` within the session, as its own principal would see them."""
    session = await inspect_session(store, tenant, session_id)
    request = SearchRequest(
        session_id=session_id, principal_id=session.principal_id, query=query, limit=_SEARCH_HITS
    )
    return await search(store, request, tenant=tenant)


async def _tenant_of(store: ConsoleStore, thread_id: str) -> str:
    # An operator follows a thread id from anywhere (a log line, a search hit): its own tenant decides.
    async with store.session() as s:
        if await s.select_head(thread_id) is None:
            raise ThreadNotFound(thread_id)
        return (await s.scope_of(thread_id)).tenant


async def read_thread(store: ConsoleStore, thread_id: str, tenant: str | None) -> ThreadPage:
    """The thread's timeline (``ThreadNotFound`` if it is not ``tenant``'s, when one is named)."""
    tenant = tenant or await _tenant_of(store, thread_id)
    service = PrepareService(store, NoticeBoard(), compaction_wait_ms=0)
    inspection = await service.inspect(thread_id, InspectRequest(limit=_TIMELINE_RECORDS), tenant=tenant)
    calls = await store.thread_tool_calls(thread_id)
    made: dict[int, list[ToolCallEntry]] = {}
    answered: dict[int, list[ToolCallEntry]] = {}
    for call in calls:
        made.setdefault(call.call_seq, []).append(call)
        if call.outcome_seq is not None:
            answered.setdefault(call.outcome_seq, []).append(call)
    records = tuple(
        TimelineRecord(
            seq=r.seq,
            kind=r.kind,
            event_key=r.event_key,
            tokens=r.tokens,
            preview=r.preview,
            calls=tuple(made.get(r.seq, ())),
            outcomes=tuple(answered.get(r.seq, ())),
        )
        for r in inspection.records
    )
    async with store.session() as s:
        state = (await s.read_states([thread_id])).get(thread_id)
    facts = tuple(sorted(state.facts.values(), key=lambda f: (f.path, f.seq))) if state else ()
    return ThreadPage(
        tenant=tenant,
        inspection=inspection,
        records=records,
        compactions=tuple(await store.thread_compactions(thread_id)),
        facts=facts,
    )


async def prepare_context(store: ConsoleStore, thread_id: str, tenant: str | None) -> ContextPage:
    """The thread's context as the assembler would prepare it now, at its session's policy budget."""
    tenant = tenant or await _tenant_of(store, thread_id)
    run_id, instance_id = split_thread_id(thread_id)
    async with store.session() as s:
        head = await s.select_head(thread_id)
        if head is None:
            raise ThreadNotFound(thread_id)
        scope = await s.scope_of(thread_id)
        if scope.tenant != tenant:
            raise ThreadNotFound(thread_id)
        pinned = await s.session_policy(head.session_id) or (DEFAULT_TENANT, "default", 1)
        found = await s.get_policy(pinned[0], pinned[1], pinned[2])
    if found is None:
        raise InvalidPolicy(f"policy {pinned[1]}@{pinned[2]} of session {head.session_id} is not registered")
    revision, policy = found
    request = PrepareRequest(
        session_id=head.session_id,
        principal_id=scope.principal_id,
        run_id=run_id,
        instance_id=instance_id,
        model_profile=policy.model_profile,
        profile=policy.profile,
        budget_tokens=policy.budget_tokens,
        wait_ms=0,
    )
    service = PrepareService(store, NoticeBoard(), compaction_wait_ms=0)
    prepared = await service.prepare(request, tenant=tenant)
    used = prepared.budget_report.used.total
    return ContextPage(
        tenant=tenant,
        thread_id=thread_id,
        policy=f"{policy.name}@{revision}",
        prepared=prepared,
        overhead=used - sum(b.tokens for b in prepared.blocks),
    )
