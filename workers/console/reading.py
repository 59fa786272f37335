"""What each console page shows, read through the app services and the store ports the process has.

Nothing here writes a record or a view: a context is shown the way ``ctxfleet context`` shows it
(``services/app/showing.py``), so looking at a thread never asks the compactor for work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from contracts import (
    ContextRequest,
    InspectRequest,
    PreparedContext,
    SearchReply,
    SearchRequest,
    SessionInspection,
    ThreadInspection,
)
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.searching import search
from services.app.showing import show_context
from services.core.block_text import BlockText, block_texts
from services.app.sessions import inspect_session
from services.core.state import Fact
from services.errors import ThreadNotFound
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
    budget_source: str
    # What the runtime's prepare would do first that showing the context did not (compact, roll over).
    runtime_would: tuple[str, ...]
    prepared: PreparedContext
    # Each block's text as the model reads it, in block order.
    texts: tuple[BlockText, ...]
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
    """The thread's context as its next prepare would answer it, at its session's policy budget:
    the one ``ctxfleet context`` shows (``services/app/showing.py``)."""
    tenant = tenant or await _tenant_of(store, thread_id)
    service = PrepareService(store, NoticeBoard(), compaction_wait_ms=0)
    shown = await show_context(store, service, thread_id, ContextRequest(), tenant=tenant)
    prepared = shown.prepared
    used = prepared.budget_report.used.total
    return ContextPage(
        tenant=tenant,
        thread_id=thread_id,
        policy=shown.policy,
        budget_source=shown.budget_source,
        runtime_would=shown.runtime_would,
        prepared=prepared,
        texts=tuple(block_texts(prepared)),
        overhead=used - sum(b.tokens for b in prepared.blocks),
    )
