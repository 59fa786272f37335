"""Loading a thread's view: head, records (cached, read incrementally), summary, state and policy.

The ledger is append-only, so a cached prefix of records never goes stale and each load reads only
what is new. Records and inherited snapshots live in one cache per process bounded by bytes
(``services/app/view_cache.py``). Policies are immutable per revision and cached forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, replace

from contracts import ContextExportPayload, ContextPolicy, EventKind, ToolCatalog

from services.core.assemble import SummaryView, ThreadSnapshot
from services.core.budget import BudgetSpec, calibrated, policy_budget
from services.app.calibrations import CalibrationCache
from services.app.view_cache import DEFAULT_CACHE_BYTES, CachedRecords, ViewCache, record_bytes
from services.core.compaction.merge import render_summary
from services.core.compaction.model import StructuredSummary
from services.core.compaction.rollup import skeleton
from services.core.compaction.policy import Counters
from services.core.turns import turns_and_steps
from contracts.exceptions import ThreadNotFound
from services.core.groups import run_task_seq
from services.core.records import LedgerRecord
from services.core.render import TokenCounts
from services.core.state import StateView
from services.store.ledger import EventOutcome, StoredHead
from services.store.ports import ViewReads
from services.store.thread_at_head import ThreadAtHead
from services.store.views import Candidate, ThreadScope, ViewState
from services.store.windows import OpenWindow
from services.core.windows.next_window import next_window_snapshot
from services.core.tokens import EncodingName, counter_for

__all__ = ["Skeleton", "ThreadView", "ViewLoader", "count_totals", "resolve_export", "skeleton_of"]


def _declared_reads(catalog: ToolCatalog | None) -> dict[str, tuple[str, ...]]:
    return {t.name: t.reads for t in catalog.tools} if catalog else {}


def resolve_export(record: LedgerRecord, sources: list[LedgerRecord]) -> LedgerRecord:
    """An export record carrying the text of the parent records it references, quoted as material."""
    parts = [f"[exported from {r.thread_id} record {r.thread_seq} ({r.kind})]\n{r.text}" for r in sources]
    note = record.text
    text = (note + "\n\n" if note else "") + "\n\n".join(parts)
    tokens = TokenCounts(
        o200k_base=record.tokens.o200k_base + sum(r.tokens.o200k_base for r in sources),
        cl100k_base=record.tokens.cl100k_base + sum(r.tokens.cl100k_base for r in sources),
    )
    payload = {**record.payload, "_resolved": True}
    return replace(record, text=text, tokens=tokens, payload=payload)


@dataclass(frozen=True, slots=True)
class Skeleton:
    """The smallest rendering of a committed summary: what a prepare falls back to when the full one
    does not fit its budget (docs/design.md, "The reduction order, and the hard limit": only what must
    survive)."""

    text: str
    tokens_o200k: int
    tokens_cl100k: int


def skeleton_of(body: StructuredSummary, revision: int, pinned: Collection[int] = ()) -> Skeleton:
    """The skeleton of ``body`` as committed at view ``revision``, counted in every encoding;
    ``pinned`` are the records shown in full beside it (the run's task)."""
    text = render_summary(skeleton(body), revision=revision, pinned=pinned)
    return Skeleton(text, counter_for("o200k_base").count(text), counter_for("cl100k_base").count(text))


@dataclass(frozen=True)
class ThreadView:
    """Everything known about one thread's view at one head."""

    head: StoredHead
    records: list[LedgerRecord]
    state: ViewState
    policy_name: str
    policy_revision: int
    policy: ContextPolicy
    budget: BudgetSpec
    scope: ThreadScope = ThreadScope()
    facts: StateView | None = None
    catalog: ToolCatalog | None = None
    skeleton: Skeleton | None = None
    # The thread's current window from 2 on (None: window 1): the view starts after it opened.
    window: OpenWindow | None = None

    def snapshot(self, upto: int | None = None) -> ThreadSnapshot:
        """The assembler's input (records up to ``upto`` if given)."""
        records = self.records if upto is None else [r for r in self.records if r.seq <= upto]
        own_thread = self.head.thread_id
        summary = None
        row = self.state.summary
        if row is not None:
            summary = SummaryView(
                summary_id=row.summary_id,
                view_revision=self.state.view_revision,
                covered_from=row.body.covered_from,
                covered_to=row.body.covered_to,
                text=row.text,
                tokens_o200k=row.tokens_o200k,
                tokens_cl100k=row.tokens_cl100k,
                sources=row.sources,
                skeleton_text=self.skeleton.text if self.skeleton else None,
                skeleton_o200k=self.skeleton.tokens_o200k if self.skeleton else 0,
                skeleton_cl100k=self.skeleton.tokens_cl100k if self.skeleton else 0,
                hooks=row.hooks,
            )
        snapshot = ThreadSnapshot(
            session_id=self.head.session_id,
            run_id=self.head.run_id,
            instance_id=self.head.instance_id,
            revision=self.head.revision,
            last_seq=self.head.last_seq if upto is None else min(upto, self.head.last_seq),
            last_event_key=self.head.last_event_key,
            records=records,
            view_revision=self.state.view_revision,
            covered_to=self.state.covered_to,
            summary=summary,
            policy=f"{self.policy_name}@{self.policy_revision}",
            own_thread=own_thread,
            facts=tuple(self.facts.facts.values()) if self.facts else (),
            reads=_declared_reads(self.catalog),
        )
        if self.window is None:
            return snapshot
        return next_window_snapshot(snapshot, self.window.handoff)

    @property
    def compaction_budget(self) -> int:
        """The budget to compact ahead of: the policy's, or the smaller one prepares wait under."""
        learned = self.state.prepare_budget
        return min(self.budget.input_budget, learned) if learned else self.budget.input_budget

    @property
    def encoding(self) -> EncodingName:
        """The encoding the policy budget is counted in (o200k_base for estimate profiles)."""
        return "cl100k_base" if self.budget.encoding == "cl100k_base" else "o200k_base"

    @property
    def totals(self) -> Counters:
        """Counter totals of everything the view holds: inherited and own records, each once."""
        return count_totals(self.records)

    @property
    def baseline(self) -> Counters:
        """Counts up to the last successful compaction's observed watermark."""
        mark = self.state.baseline_watermark
        return count_totals([r for r in self.records if r.seq <= mark]) if mark else Counters()

    @property
    def watermark(self) -> int:
        """The session seq of the newest record in the view."""
        return self.records[-1].seq if self.records else 0


def count_totals(records: list[LedgerRecord]) -> Counters:
    """Counter totals of exactly these records (docs/design.md, "Counting turns and steps")."""
    return Counters(*turns_and_steps(records))


@dataclass(frozen=True, slots=True)
class _Pinned:
    policy_name: str
    policy_revision: int
    catalog: ToolCatalog | None


@dataclass(frozen=True, slots=True)
class _Facts:
    revision: int
    facts: StateView | None


class ViewLoader:
    """Loads thread views through one per-process cache bounded by bytes (``cache``)."""

    def __init__(self, *, cache: ViewCache | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        # One cache for every worker of the process (workers/compose.py passes the same loader around).
        self.cache = cache if cache is not None else ViewCache(cache_bytes)
        self._locks: dict[str, asyncio.Lock] = {}
        self._policies: dict[tuple[str, str, int], ContextPolicy] = {}
        # The policy budget is held in the provider's count, so the budgeter compacts ahead of what
        # the provider will accept; prepares share this cache (one per process).
        self.calibrations = CalibrationCache()

    def held_earlier(self, summary_id: str) -> tuple[SummaryView, ...] | None:
        """The summaries ``summary_id`` extends, if this process read them already."""
        found = self.cache.get(("earlier", summary_id))
        return found if isinstance(found, tuple) else None

    async def earlier_summaries(self, conn: ViewReads, view: ThreadView) -> tuple[SummaryView, ...]:
        """The summaries the view's committed one extends, oldest first: each covers a shorter prefix
        of the ledger (services/core/history_depth.py). Immutable, so read once per summary."""
        row = view.state.summary
        if row is None:
            return ()
        found = self.held_earlier(row.summary_id)
        if found is not None:
            return found
        key = ("earlier", row.summary_id)
        chain = await conn.summary_chain(row.summary_id)
        earlier = tuple(
            SummaryView(
                summary_id=r.summary_id,
                view_revision=revision,
                covered_from=r.body.covered_from,
                covered_to=r.body.covered_to,
                text=r.text,
                tokens_o200k=r.tokens_o200k,
                tokens_cl100k=r.tokens_cl100k,
                sources=r.sources,
                hooks=r.hooks,
            )
            for revision, r in reversed(chain)
        )
        self._evicted(self.cache.put(key, earlier, 1_000 + sum(3 * len(e.text) for e in earlier)))
        return earlier

    async def load(
        self,
        conn: ViewReads,
        thread_id: str,
        *,
        tenant: str | None = None,
        session_id: str | None = None,
        principal_id: str | None = None,
        enforce_principal: bool = False,
    ) -> ThreadView:
        """The view of ``thread_id``: what it inherited, what was exported to it, and its own records.

        ThreadNotFound if it has no records, or belongs to another tenant, session or principal — a
        foreign thread is reported exactly like a missing one, so ids cannot be probed.
        """
        after = self._held_records(thread_id)
        at_head = await self._at_head(conn, thread_id, after)
        if at_head is None:
            raise ThreadNotFound(thread_id)
        return await self._build(conn, at_head, after, tenant, session_id, principal_id, enforce_principal)

    async def load_naming(
        self,
        conn: ViewReads,
        thread_id: str,
        event_key: str,
        *,
        tenant: str,
        session_id: str,
        principal_id: str | None,
    ) -> tuple[ThreadView | None, EventOutcome | None]:
        """What became of ``event_key`` in ``tenant``'s thread, and once it is recorded, the thread's
        view (which holds it: both come from one statement); ``None`` for the outcome when the thread
        has no head yet or is another tenant's (whose refusal of the key the caller asks about)."""
        after = self._held_records(thread_id)
        at_head = await self._at_head(conn, thread_id, after, event_key)
        named = at_head.named if at_head is not None else None
        if at_head is None or named is None or at_head.scope.tenant != tenant:
            return None, None
        if named.seq is None:
            return None, named
        view = await self._build(conn, at_head, after, tenant, session_id, principal_id, True)
        return view, named

    async def _at_head(
        self, conn: ViewReads, thread_id: str, after: int, event_key: str | None = None
    ) -> ThreadAtHead | None:
        # Head, scope, compaction state, open window and the records after the ones held, in one round
        # trip, from one snapshot.
        held = self._held_facts(thread_id)
        return await conn.thread_at_head(
            thread_id,
            facts_of_revision=held.revision if held is not None else None,
            records_after=after,
            event_key=event_key,
        )

    async def _build(
        self,
        conn: ViewReads,
        at_head: ThreadAtHead,
        after: int,
        tenant: str | None,
        session_id: str | None,
        principal_id: str | None,
        enforce_principal: bool,
    ) -> ThreadView:
        head, scope = at_head.head, at_head.scope
        thread_id = head.thread_id
        if session_id is not None and head.session_id != session_id:
            raise ThreadNotFound(thread_id)
        if tenant is not None and scope.tenant != tenant:
            raise ThreadNotFound(thread_id)
        if enforce_principal and scope.principal_id is not None and principal_id != scope.principal_id:
            raise ThreadNotFound(thread_id)
        entry, own = await self._records(conn, thread_id, head, fetched=(after, at_head.records))
        own = await self._resolve_exports(conn, own, entry)
        inherited = await self._inherited(conn, head.session_id, thread_id, scope)
        # Seqs start at 1: with nothing inherited and no reset, the view is the cached list itself, the
        # same object on every prepare until a record is added (copying it is 5 % of a prepare of a
        # 5,000-record thread). Nobody changes a view's list in place.
        if inherited or scope.reset_seq > 0:
            records = [r for r in (*inherited, *own) if r.seq > scope.reset_seq]
        else:
            records = own
        state = at_head.state
        if scope.role == "main" and scope.snapshot_through > scope.reset_seq and state.summary is None:
            if await self._adopt(conn, head, scope, records, state):
                state = await conn.load_view(thread_id)
        name, revision, catalog = await self._pinned(conn, head.session_id, scope.tenant)
        policy = await self._policy(conn, scope.tenant, name, revision)
        facts = await self._facts(conn, at_head)
        skeleton = self._skeleton(state, records, thread_id)
        return ThreadView(
            head,
            records,
            state,
            name,
            revision,
            policy,
            await self._budget(conn, scope.tenant, policy),
            scope,
            facts,
            catalog,
            skeleton,
            at_head.window,
        )

    async def _pinned(
        self, conn: ViewReads, session_id: str, tenant: str
    ) -> tuple[str, int, ToolCatalog | None]:
        """The policy and tool catalog a session pinned at its first event: they never change."""
        key = ("pinned", session_id)
        found = self.cache.get(key)
        if isinstance(found, _Pinned):
            return found.policy_name, found.policy_revision, found.catalog
        pinned = await conn.session_policy(session_id)
        _, name, revision = pinned or (tenant, "default", 1)
        catalog = await conn.read_session_catalog(session_id)
        if pinned is not None:  # a session without its row yet is not pinned: ask again next time
            size = 1_000 + (len(catalog.model_dump_json()) * 3 if catalog else 0)
            self._evicted(self.cache.put(key, _Pinned(name, revision, catalog), size))
        return name, revision, catalog

    def _held_facts(self, thread_id: str) -> _Facts | None:
        found = self.cache.get(("facts", thread_id))
        return found if isinstance(found, _Facts) else None

    async def _facts(self, conn: ViewReads, at_head: ThreadAtHead) -> StateView | None:
        """The thread's current facts: written by the recorder with the records, in the transaction
        that moves the head, so an entry of the same head revision is current."""
        head = at_head.head
        key = ("facts", head.thread_id)
        found = self._held_facts(head.thread_id)
        if found is not None and found.revision == head.revision:
            return found.facts
        if at_head.facts_read:
            facts = at_head.facts
        else:  # held for the revision the head had when it was read: a concurrent load replaced them
            facts = (await conn.read_states([head.thread_id])).get(head.thread_id)
        self._evicted(self.cache.put(key, _Facts(head.revision, facts), _facts_bytes(facts)))
        return facts

    async def _budget(self, conn: ViewReads, tenant: str, policy: ContextPolicy) -> BudgetSpec:
        spec = policy_budget(policy)
        return calibrated(spec, await self.calibrations.get(conn, tenant, spec.profile))

    def _skeleton(self, state: ViewState, records: list[LedgerRecord], thread_id: str) -> Skeleton | None:
        row = state.summary
        if row is None:
            return None
        # Summaries are immutable: a skeleton is rendered and counted once per summary. An adopted
        # summary is shown beside another run's task: cached per thread too.
        key = ("skeleton", row.summary_id, thread_id)
        found = self.cache.get(key)
        if isinstance(found, Skeleton):
            return found
        task = run_task_seq(records, thread_id)
        made = skeleton_of(row.body, state.view_revision, (task,) if task is not None else ())
        self._evicted(self.cache.put(key, made, 1_000 + 2 * len(made.text)))
        return made

    async def _inherited(
        self, conn: ViewReads, session_id: str, thread_id: str, scope: ThreadScope
    ) -> list[LedgerRecord]:
        """The run's immutable snapshot: the session's main-thread records up to its boundary."""
        if scope.role != "main" or scope.snapshot_through <= 0:
            return []
        # Immutable (a run's snapshot boundary never moves, nor a fork's branch point), so an entry is
        # valid for as long as it lives.
        key = ("inherited", session_id, scope.snapshot_through, scope.reset_seq, thread_id)
        cached = self.cache.get(key)
        if isinstance(cached, list):
            return cached
        ancestors = await self._ancestry(conn, session_id, scope.snapshot_through, scope.reset_seq)
        records = ancestors + await conn.select_inherited(
            session_id, after=scope.reset_seq, through=scope.snapshot_through, exclude_thread=thread_id
        )
        self._evicted(self.cache.put(key, records, record_bytes(records)))
        return records

    async def _ancestry(
        self, conn: ViewReads, session_id: str, through: int, after: int
    ) -> list[LedgerRecord]:
        """A fork's history before its own records: its parent's main-thread records up to the branch
        point, and so on up the chain — read, never copied, never changed."""
        origin = await conn.select_fork(session_id)
        if origin is None:
            return []
        upto = min(through, origin.at_seq)
        older = await self._ancestry(conn, origin.parent_session_id, upto, after)
        own = await conn.select_inherited(
            origin.parent_session_id, after=after, through=upto, exclude_thread=""
        )
        return older + own

    async def _resolve_exports(
        self, conn: ViewReads, records: list[LedgerRecord], entry: CachedRecords
    ) -> list[LedgerRecord]:
        """A child's exported background, resolved to the parent records it references (once per entry:
        the parent records are immutable)."""
        if not entry.exports:
            return records
        out = list(records)
        for position in entry.exports:
            if position >= len(out):
                break  # this load serves an older head than the entry holds
            record = out[position]
            body = record.body
            assert isinstance(body, ContextExportPayload), "exports are found as records arrive"
            resolved = entry.resolved.get(record.seq)
            if resolved is None or resolved.event_key != record.event_key:
                resolved = resolve_export(
                    record, await conn.select_refs([(r.thread_id, r.seq) for r in body.refs])
                )
                entry.resolved[record.seq] = resolved
            out[position] = resolved
        return out

    async def _adopt(
        self,
        conn: ViewReads,
        head: StoredHead,
        scope: ThreadScope,
        records: list[LedgerRecord],
        state: ViewState,
    ) -> bool:
        """Inherit the newest summary of an earlier run whose covered records are a prefix of ours."""
        for candidate in await self._candidates(
            conn, head.session_id, head.thread_id, scope.snapshot_through
        ):
            other = await self.load(conn, candidate.thread_id)
            theirs = [r.seq for r in other.records if r.seq <= candidate.covered_to]
            ours = [r.seq for r in records if r.seq <= candidate.covered_to]
            if theirs == ours and ours:
                return await conn.adopt(head.thread_id, state.view_revision, candidate)
        return False

    async def _candidates(
        self, conn: ViewReads, session_id: str, thread_id: str, through: int
    ) -> list[Candidate]:
        """Summaries a run may adopt, newest coverage first: its session's earlier runs', and for a fork
        its ancestors' up to the branch point — a fork of a compacted session need not compact the
        same history again. Adopting only points the fork's own view at the summary."""
        found = await conn.candidates(session_id, thread_id, through)
        origin = await conn.select_fork(session_id)
        if origin is not None:
            upto = min(through, origin.at_seq)
            # A summary the parent committed after the point counted steps the fork does not hold:
            # its baseline watermark would count the fork's own records as compacted.
            found += [
                c
                for c in await self._candidates(conn, origin.parent_session_id, "", upto)
                if c.baseline_watermark <= upto
            ]
        return sorted(found, key=lambda c: -c.covered_to)

    async def _policy(self, conn: ViewReads, tenant: str, name: str, revision: int) -> ContextPolicy:
        key = (tenant, name, revision)
        policy = self._policies.get(key)
        if policy is None:
            found = await conn.get_policy(tenant, name, revision)
            if found is None:
                raise ThreadNotFound(f"policy {name}@{revision}")
            policy = self._policies[key] = found[1]
        return policy

    def _held_records(self, thread_id: str) -> int:
        """The seq up to which this process holds the thread's records (0: none)."""
        found = self.cache.get(("records", thread_id))
        return found.last_seq if isinstance(found, CachedRecords) else 0

    async def _records(
        self,
        conn: ViewReads,
        thread_id: str,
        head: StoredHead,
        *,
        fetched: tuple[int, list[LedgerRecord] | None] = (0, None),
    ) -> tuple[CachedRecords, list[LedgerRecord]]:
        """The thread's records up to ``head``, from the cache and what was read since; ``fetched``:
        the records after a seq that came with the head, used when the cache still ends there."""
        lock = self._locks.setdefault(thread_id, asyncio.Lock())
        async with lock:
            key = ("records", thread_id)
            found = self.cache.get(key)
            cached = found if isinstance(found, CachedRecords) else CachedRecords(0, [])
            if cached.last_seq < head.last_seq:
                after, read = fetched
                if read is not None and after == cached.last_seq:
                    new = read
                else:  # a concurrent load moved the cache (or evicted it) since the head was read
                    new = await conn.select_records(thread_id, gt=cached.last_seq, lte=head.last_seq)
                start = len(cached.records)
                cached = CachedRecords(
                    head.last_seq,
                    cached.records + new,
                    cached.record_bytes + record_bytes(new),
                    cached.resolved,
                    cached.exports
                    + tuple(start + n for n, record in enumerate(new) if _unresolved_export(record)),
                )
            self._evicted(self.cache.put(key, cached, cached.record_bytes))
            if cached.last_seq == head.last_seq:
                return cached, cached.records
            # A later head may already be cached by a concurrent load: serve exactly this head.
            return cached, [r for r in cached.records if r.thread_seq <= head.last_seq]

    def _evicted(self, keys: list[object]) -> None:
        for key in keys:
            if isinstance(key, tuple) and key[0] == "records":
                self._locks.pop(str(key[1]), None)


def _facts_bytes(facts: StateView | None) -> int:
    """What a thread's facts count against the view cache's bound (an estimate)."""
    return 1_000 + (2_000 * len(facts.facts) if facts else 0)


def _unresolved_export(record: LedgerRecord) -> bool:
    return record.kind is EventKind.CONTEXT_EXPORT and record.payload.get("_resolved") is not True
