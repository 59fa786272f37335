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
    ThreadInspection,
)
from contracts.subjects import DEFAULT_TENANT
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.searching import search
from services.app.showing import show_context
from services.core.assemble import added_tokens
from services.core.block_text import BlockText, block_texts
from services.app.sessions import inspect_session
from services.core.compaction.policy import ratio_threshold
from services.core.served import BlockChange, ServedDiff, diff_served
from services.core.state import Fact
from contracts.exceptions import ThreadNotFound
from services.store.listing import CompactionEntry, ServedStep, SessionListing, ToolCallEntry
from services.store.ports import ListingStore, PrepareStore, QueryStore

from .chart import CATEGORIES, ChartLine, ChartMark, ChartStep, timeline_svg

__all__ = [
    "CompactionPage",
    "ConsoleStore",
    "ContextPage",
    "ServedPage",
    "ServedRow",
    "StepPage",
    "ThreadPage",
    "TimelineRecord",
    "prepare_context",
    "read_compaction",
    "read_search",
    "read_served",
    "read_served_step",
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
    # The thread's whole history as ``ctxfleet compact`` counts it, and what this context's request and
    # hooks added beside it (``ContextShown.history_tokens``, ``added_tokens``).
    history: int = 0
    added: int = 0


async def read_sessions(store: ListingStore, tenant: str | None) -> list[SessionListing]:
    return await store.list_sessions(tenant, _SESSIONS_SHOWN)


async def read_search(store: ConsoleStore, tenant: str, session_id: str, query: str) -> SearchReply:
    """The best hits of ``query`` within the session, as its own principal would see them."""
    session = await inspect_session(store, tenant, session_id)
    request = SearchRequest(
        session_id=session_id, principal_id=session.principal_id, query=query, limit=_SEARCH_HITS
    )
    return await search(store, request, tenant=tenant)


async def _tenant_of(store: ConsoleStore, thread_id: str) -> str:
    # An operator follows a thread id from anywhere (a log line, a search hit): its own tenant decides.
    async with store.connection() as s:
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
    async with store.connection() as s:
        state = (await s.read_states([thread_id])).get(thread_id)
    facts = tuple(sorted(state.facts.values(), key=lambda f: (f.path, f.seq))) if state else ()
    return ThreadPage(
        tenant=tenant,
        inspection=inspection,
        records=records,
        compactions=tuple(await store.thread_compactions(thread_id)),
        facts=facts,
    )


async def prepare_context(
    store: ConsoleStore, service: PrepareService, thread_id: str, tenant: str | None
) -> ContextPage:
    """The thread's context as its next prepare would answer it, at its session's policy budget:
    the one ``ctxfleet context`` shows (``services/app/showing.py``), by the process's own
    ``service`` — its prepare hooks called, its calibration applied."""
    tenant = tenant or await _tenant_of(store, thread_id)
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
        history=shown.history_tokens,
        added=added_tokens(prepared),
    )


@dataclass(frozen=True, slots=True)
class ServedRow:
    """A served step as the history lists it: the step and what changed since the one before."""

    served: ServedStep
    diff: ServedDiff


@dataclass(frozen=True, slots=True)
class ServedPage:
    """A thread's served history: every step kept, its diff counts, and the chart of them all."""

    tenant: str
    thread_id: str
    rows: tuple[ServedRow, ...]
    chart: str
    compactions: tuple[CompactionEntry, ...]


@dataclass(frozen=True, slots=True)
class StepPage:
    """One served context as the model saw it, and its diff against the step before."""

    tenant: str
    thread_id: str
    step: ServedStep
    previous: ServedStep | None
    next_step: int | None
    diff: ServedDiff
    # Block texts by digest: this step's blocks and the previous step's changed or removed ones.
    texts: dict[str, str]


@dataclass(frozen=True, slots=True)
class CompactionPage:
    """A compaction: the last step served before it, the first after, what left, what replaced it."""

    tenant: str
    thread_id: str
    compaction: CompactionEntry
    before: ServedStep | None
    after: ServedStep | None
    # The blocks of ``before`` that ``after`` no longer shows.
    left: tuple[BlockChange, ...]
    texts: dict[str, str]


async def _owned(store: ConsoleStore, thread_id: str, tenant: str | None) -> str:
    """The thread's tenant; ``ThreadNotFound`` when ``tenant`` is named and is not it."""
    owner = await _tenant_of(store, thread_id)
    if tenant is not None and tenant != owner:
        raise ThreadNotFound(thread_id)
    return owner


async def _steps(store: ConsoleStore, thread_id: str, tenant: str) -> list[ServedStep]:
    return [s for s in await store.thread_served(thread_id) if s.served.tenant == tenant]


async def _lines(store: ConsoleStore, tenant: str, steps: list[ServedStep]) -> list[ChartLine]:
    """The newest step's budget, and its policy's compaction trigger and water levels, in tokens."""
    if not steps:
        return []
    last = steps[-1].served
    lines = [ChartLine("budget", last.input_budget, "#111827")]
    name, _, revision = last.policy.rpartition("@")
    found = None
    if name and revision.isdigit():
        async with store.connection() as s:
            found = await s.get_policy(tenant, name, int(revision)) or await s.get_policy(
                DEFAULT_TENANT, name, int(revision)
            )
    if found is not None:
        policy = found[1]
        budget = last.input_budget
        ratio = policy.compaction.triggers.context_ratio
        if ratio is not None:
            lines.append(ChartLine("trigger", ratio_threshold(ratio, budget), "#b45309", dashed=True))
        levels = policy.window.levels
        for level, share, colour in (
            ("yellow", levels.yellow, "#ca8a04"),
            ("orange", levels.orange, "#ea580c"),
            ("red", levels.red, "#dc2626"),
        ):
            lines.append(ChartLine(level, ratio_threshold(share, budget), colour, dashed=True))
    return lines


def _marks(steps: list[ServedStep]) -> list[ChartMark]:
    marks: list[ChartMark] = []
    for before, after in zip(steps, steps[1:], strict=False):
        if after.served.window != before.served.window:
            marks.append(ChartMark(after.step, f"rollover w{after.served.window}", "rollover"))
        elif after.served.view_revision != before.served.view_revision:
            marks.append(ChartMark(after.step, f"compaction {after.served.view_revision}", "compaction"))
    return marks


def _tokens(step: ServedStep) -> dict[str, int]:
    used = step.served.used
    return {name: int(getattr(used, name)) for name, _ in CATEGORIES}


async def read_served(store: ConsoleStore, thread_id: str, tenant: str | None) -> ServedPage:
    """The contexts the fleet answered the thread, each with its diff, and the chart of them."""
    tenant = await _owned(store, thread_id, tenant)
    steps = await _steps(store, thread_id, tenant)
    rows = tuple(
        ServedRow(s, diff_served(steps[n - 1].served if n else None, s.served)) for n, s in enumerate(steps)
    )
    chart = timeline_svg(
        [ChartStep(s.step, _tokens(s)) for s in steps], await _lines(store, tenant, steps), _marks(steps)
    )
    return ServedPage(
        tenant=tenant,
        thread_id=thread_id,
        rows=rows,
        chart=chart,
        compactions=tuple(await store.thread_compactions(thread_id)),
    )


async def read_served_step(store: ConsoleStore, thread_id: str, step: int, tenant: str | None) -> StepPage:
    """Step ``step`` as the model saw it (``ThreadNotFound`` when it is not kept)."""
    tenant = await _owned(store, thread_id, tenant)
    steps = await _steps(store, thread_id, tenant)
    at = next((n for n, s in enumerate(steps) if s.step == step), None)
    if at is None:
        raise ThreadNotFound(f"{thread_id} step {step}")
    current = steps[at]
    previous = steps[at - 1] if at else None
    diff = diff_served(None if previous is None else previous.served, current.served)
    digests = {b.digest for b in current.served.blocks} | {
        c.before.digest if c.before is not None else c.block.digest for c in diff.changes
    }
    return StepPage(
        tenant=tenant,
        thread_id=thread_id,
        step=current,
        previous=previous,
        next_step=steps[at + 1].step if at + 1 < len(steps) else None,
        diff=diff,
        texts=await store.served_texts(thread_id, sorted(digests)),
    )


async def read_compaction(
    store: ConsoleStore, thread_id: str, view_revision: int, tenant: str | None
) -> CompactionPage:
    """The compaction that made view ``view_revision``, with the steps served around it."""
    tenant = await _owned(store, thread_id, tenant)
    compaction = next(
        (c for c in await store.thread_compactions(thread_id) if c.view_revision == view_revision), None
    )
    if compaction is None:
        raise ThreadNotFound(f"{thread_id} compaction {view_revision}")
    steps = await _steps(store, thread_id, tenant)
    before = next((s for s in reversed(steps) if s.served.view_revision < view_revision), None)
    after = next((s for s in steps if s.served.view_revision >= view_revision), None)
    left: tuple[BlockChange, ...] = ()
    texts: dict[str, str] = {}
    if before is not None and after is not None:
        left = tuple(c for c in diff_served(before.served, after.served).changes if c.change == "removed")
        digests = {c.block.digest for c in left} | {
            b.digest for b in after.served.blocks if b.kind == "summary"
        }
        texts = await store.served_texts(thread_id, sorted(digests))
    return CompactionPage(tenant, thread_id, compaction, before, after, left, texts)
