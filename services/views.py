"""Loading a thread's view: head, records (cached, read incrementally), summary, state and policy.

The ledger is append-only, so a cached prefix of records never goes stale and each load reads only
what is new. Policies are immutable per revision and cached forever.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

import asyncpg

from contracts import ContextPolicy

from .assemble import SummaryView, ThreadSnapshot
from .budget import BudgetSpec, policy_budget
from .compaction.merge import summary_sources
from .compaction.policy import Counters
from .errors import ThreadNotFound
from .records import LedgerRecord
from .store.ledger import Conn, HeadsRepo, RecordsRepo, StoredHead
from .store.views import PoliciesRepo, ViewsRepo, ViewState
from .tokens import EncodingName

__all__ = ["ThreadView", "ViewLoader", "count_totals"]


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

    def snapshot(self, upto: int | None = None) -> ThreadSnapshot:
        """The assembler's input (records up to ``upto`` if given)."""
        records = self.records if upto is None else [r for r in self.records if r.seq <= upto]
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
                sources=tuple(summary_sources(row.body)),
            )
        return ThreadSnapshot(
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
        )

    @property
    def encoding(self) -> EncodingName:
        """The encoding the policy budget is counted in (o200k_base for estimate profiles)."""
        return "cl100k_base" if self.budget.encoding == "cl100k_base" else "o200k_base"

    @property
    def totals(self) -> Counters:
        """Counter totals at the head."""
        return Counters(self.head.user_turns, self.head.model_steps)


def count_totals(records: list[LedgerRecord]) -> Counters:
    """Counter totals of exactly these records (seed 000 §5.2 counting rules)."""
    turns = sum(1 for r in records if r.kind == "user_input" and r.payload.get("intent", "question") == "question")
    steps = sum(1 for r in records if r.kind == "assistant_message" and r.payload.get("purpose", "action") == "action")
    return Counters(turns, steps)


@dataclass
class _Cached:
    last_seq: int
    records: list[LedgerRecord]


class ViewLoader:
    """Loads thread views with a per-process record cache."""

    def __init__(self, pool: asyncpg.Pool, *, cache_threads: int = 1024) -> None:
        self._pool = pool
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._cache_threads = cache_threads
        self._locks: dict[str, asyncio.Lock] = {}
        self._policies: dict[tuple[str, int], ContextPolicy] = {}

    async def load(self, conn: Conn, thread_id: str, *, session_id: str | None = None) -> ThreadView:
        """The view of ``thread_id``; ThreadNotFound if it has no records (or is another session's)."""
        head = await HeadsRepo.select_head(conn, thread_id)
        # Another session's thread is reported exactly like a missing one: no existence leak.
        if head is None or (session_id is not None and head.session_id != session_id):
            raise ThreadNotFound(thread_id)
        records = await self._records(conn, thread_id, head)
        state = await ViewsRepo.load(conn, thread_id)
        name, revision = await PoliciesRepo.of_session(conn, head.session_id) or ("default", 1)
        policy = await self._policy(conn, name, revision)
        return ThreadView(head, records, state, name, revision, policy, policy_budget(policy))

    async def _policy(self, conn: Conn, name: str, revision: int) -> ContextPolicy:
        key = (name, revision)
        policy = self._policies.get(key)
        if policy is None:
            found = await PoliciesRepo.get(conn, name, revision)
            if found is None:
                raise ThreadNotFound(f"policy {name}@{revision}")
            policy = self._policies[key] = found[1]
        return policy

    async def _records(self, conn: Conn, thread_id: str, head: StoredHead) -> list[LedgerRecord]:
        lock = self._locks.setdefault(thread_id, asyncio.Lock())
        async with lock:
            cached = self._cache.get(thread_id) or _Cached(0, [])
            if cached.last_seq < head.last_seq:
                new = await RecordsRepo.select_records(conn, thread_id, gt=cached.last_seq, lte=head.last_seq)
                cached = _Cached(head.last_seq, cached.records + new)
            self._cache[thread_id] = cached
            self._cache.move_to_end(thread_id)
            while len(self._cache) > self._cache_threads:
                evicted, _ = self._cache.popitem(last=False)
                self._locks.pop(evicted, None)
            if cached.last_seq == head.last_seq:
                return cached.records
            # A later head may already be cached by a concurrent load: serve exactly this head.
            return [r for r in cached.records if r.seq <= head.last_seq]
