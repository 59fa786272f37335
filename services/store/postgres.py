"""The PostgreSQL store: the ports of ``ports.py`` over an asyncpg pool.

Every method runs under ``translate_pg_errors`` (acquiring a connection and opening a transaction
too), so what leaves this module is a fleet error, never a driver type.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import asyncpg

from contracts import (
    ContextPolicy,
    InspectedDeadLetter,
    Receipt,
    SearchHit,
    SearchRequest,
    SessionInspection,
    ToolCatalog,
)
from contracts.hooks import HookSet
from contracts.prepare import ProviderOverflow
from contracts.windows import WindowHandoff

from services.core.baseline import PositionReset, Positions
from services.core.calibration import Calibration
from services.core.compaction.policy import Throttle
from services.core.hashing import ChainLink
from services.core.ledger import BatchKeys, BatchPlan, LedgerReads, Rejection
from services.core.records import LedgerRecord
from services.core.state import StateView
from services.store import batches, branches, listing, queries
from services.store.batch_write import LedgerWritten, Position
from services.store import hook_sets as hooks_sql
from services.store import search as search_sql
from services.store._errors import translate_pg_errors
from services.store.branches import ForkOrigin, ForkParent, HistoryRow, NewFork
from services.store.calibration import CalibrationsRepo
from services.store.ledger import (
    Conn,
    EventOutcome,
    EvidenceRow,
    HeadsRepo,
    RecordsRepo,
    StoredHead,
    TailRecord,
)
from services.store.tracking import DeadLettersRepo, TrackingRepo
from services.store.thread_at_head import ThreadAtHead, read_thread_at_head
from services.store.windows import OpenWindow, WindowsRepo
from services.store.views import (
    DEFAULT_SUMMARY_CACHE_BYTES,
    Candidate,
    NewSummary,
    PoliciesRepo,
    ScopeRepo,
    SummaryRow,
    SummaryRows,
    ThreadScope,
    ViewsRepo,
    ViewState,
)

if TYPE_CHECKING:
    from services.store.ports import (
        BranchStore,
        BudgetStore,
        CompactionStore,
        IndexStore,
        ListingStore,
        PrepareStore,
        QueryStore,
        RecordingStore,
    )

__all__ = ["LockedPositions", "PgConnection", "PgStore"]

_P = ParamSpec("_P")
_T = TypeVar("_T")
_S = TypeVar("_S")


def _translated(
    method: Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]]:
    @functools.wraps(method)
    async def run(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        with translate_pg_errors():
            return await method(self, *args, **kwargs)

    return run


class PgConnection:
    """One borrowed connection, for a service's unit of work."""

    def __init__(self, conn: Conn, summaries: SummaryRows | None = None) -> None:
        self._conn = conn
        self._summaries = summaries

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """A transaction (a savepoint inside another one); its commit is translated too."""
        with translate_pg_errors():
            async with self._conn.transaction():
                yield

    # Recording.

    @_translated
    async def max_tracking_seq(self, consumer: str, partition: int) -> int:
        return await TrackingRepo.max_tracking_seq(self._conn, consumer, partition)

    @_translated
    async def insert_tracking(self, consumer: str, partition: int, stream_seq: int) -> None:
        await TrackingRepo.insert_tracking(self._conn, consumer, partition, stream_seq)

    @_translated
    async def read_for_batch(self, wanted: BatchKeys, tracking: tuple[str, int] | None = None) -> LedgerReads:
        return await batches.read_for_batch(self._conn, wanted, tracking)

    @_translated
    async def write_plan(
        self,
        plan: BatchPlan,
        *,
        recorded_by: str,
        keep_raw: int,
        position: Position | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> LedgerWritten:
        # Looked up on the module at call time, so a test can make one plan fail as the server would.
        return await batches.write_plan(
            self._conn,
            plan,
            recorded_by=recorded_by,
            keep_raw=keep_raw,
            position=position,
            before_commit=before_commit,
        )

    @_translated
    async def insert_dead_letter(self, rejection: Rejection, *, keep_raw: int) -> None:
        await DeadLettersRepo.insert(self._conn, rejection, keep_raw=keep_raw)

    # Views.

    @_translated
    async def select_head(self, thread_id: str) -> StoredHead | None:
        return await HeadsRepo.select_head(self._conn, thread_id)

    @_translated
    async def scope_of(self, thread_id: str) -> ThreadScope:
        return await ScopeRepo.of_thread(self._conn, thread_id)

    @_translated
    async def select_records(self, thread_id: str, *, gt: int, lte: int) -> list[LedgerRecord]:
        return await RecordsRepo.select_records(self._conn, thread_id, gt=gt, lte=lte)

    @_translated
    async def select_inherited(
        self, session_id: str, *, after: int, through: int, exclude_thread: str
    ) -> list[LedgerRecord]:
        return await RecordsRepo.select_inherited(
            self._conn, session_id, after=after, through=through, exclude_thread=exclude_thread
        )

    @_translated
    async def select_refs(self, refs: Sequence[tuple[str, int]]) -> list[LedgerRecord]:
        return await RecordsRepo.select_refs(self._conn, refs)

    # Branches (forks and exports).

    @_translated
    async def select_fork(self, session_id: str) -> ForkOrigin | None:
        return await branches.select_fork(self._conn, session_id)

    @_translated
    async def select_fork_parent(self, tenant: str, session_id: str) -> ForkParent | None:
        return await branches.select_fork_parent(self._conn, tenant, session_id)

    @_translated
    async def insert_fork(self, fork: NewFork) -> bool:
        return await branches.insert_fork(self._conn, fork)

    @_translated
    async def last_reset(self, session_id: str, through: int) -> int:
        return await branches.last_reset(self._conn, session_id, through)

    @_translated
    async def select_history(
        self, session_id: str, *, after: int, through: int, limit: int
    ) -> list[HistoryRow]:
        return await branches.select_history(
            self._conn, session_id, after=after, through=through, limit=limit
        )

    @_translated
    async def thread_at_head(
        self,
        thread_id: str,
        *,
        facts_of_revision: int | None = None,
        records_after: int | None = None,
        event_key: str | None = None,
    ) -> ThreadAtHead | None:
        return await read_thread_at_head(
            self._conn,
            thread_id,
            self._summaries,
            facts_of_revision=facts_of_revision,
            records_after=records_after,
            event_key=event_key,
        )

    @_translated
    async def load_view(self, thread_id: str) -> ViewState:
        return await ViewsRepo.load(self._conn, thread_id, self._summaries)

    @_translated
    async def summary_chain(self, summary_id: str) -> list[tuple[int, SummaryRow]]:
        return await ViewsRepo.summary_chain(self._conn, summary_id)

    @_translated
    async def current_window(self, thread_id: str) -> OpenWindow | None:
        return await WindowsRepo.current(self._conn, thread_id)

    @_translated
    async def windows_closed_after(self, thread_id: str) -> list[int]:
        return await WindowsRepo.closed_after(self._conn, thread_id)

    @_translated
    async def commit_window(self, expected_view_revision: int, handoff: WindowHandoff, tokens: int) -> int:
        return await WindowsRepo.commit(self._conn, expected_view_revision, handoff, tokens)

    @_translated
    async def candidates(self, session_id: str, thread_id: str, through: int) -> list[Candidate]:
        return await ViewsRepo.candidates(self._conn, session_id, thread_id, through)

    @_translated
    async def adopt(self, thread_id: str, expected_revision: int, candidate: Candidate) -> bool:
        return await ViewsRepo.adopt(self._conn, thread_id, expected_revision, candidate)

    @_translated
    async def session_policy(self, session_id: str) -> tuple[str, str, int] | None:
        return await PoliciesRepo.of_session(self._conn, session_id)

    @_translated
    async def get_policy(
        self, tenant: str, name: str, revision: int | None = None
    ) -> tuple[int, ContextPolicy] | None:
        return await PoliciesRepo.get(self._conn, tenant, name, revision)

    @_translated
    async def read_states(self, thread_ids: Sequence[str]) -> dict[str, StateView]:
        return await batches.read_states(self._conn, thread_ids)

    @_translated
    async def read_session_catalog(self, session_id: str) -> ToolCatalog | None:
        return await batches.read_session_catalog(self._conn, session_id)

    @_translated
    async def ensure_view(self, thread_id: str) -> None:
        await ViewsRepo.ensure(self._conn, thread_id)

    @_translated
    async def note_prepare_budget(self, thread_id: str, budget: int, reserved: int) -> None:
        await ViewsRepo.note_prepare_budget(self._conn, thread_id, budget, reserved)

    @_translated
    async def set_pending(self, thread_id: str, fingerprint: str, *, stale_after_s: float) -> bool:
        return await ViewsRepo.set_pending(self._conn, thread_id, fingerprint, stale_after_s=stale_after_s)

    @_translated
    async def clear_pending(self, thread_id: str, fingerprint: str) -> None:
        await ViewsRepo.clear_pending(self._conn, thread_id, fingerprint)

    @_translated
    async def mark_evaluated(self, thread_id: str, head_revision: int) -> None:
        await ViewsRepo.mark_evaluated(self._conn, thread_id, head_revision)

    @_translated
    async def record_attempt(
        self,
        thread_id: str,
        *,
        throttle: Throttle | None,
        reason: str | None,
        failed: bool,
        fingerprint: str | None,
        counts_as_attempt: bool = True,
    ) -> None:
        await ViewsRepo.record_attempt(
            self._conn,
            thread_id,
            throttle=throttle,
            reason=reason,
            failed=failed,
            fingerprint=fingerprint,
            counts_as_attempt=counts_as_attempt,
        )

    @_translated
    async def commit_summary(self, expected_revision: int, summary: NewSummary) -> str:
        return await ViewsRepo.commit(self._conn, expected_revision, summary)

    # Prepares and inspections.

    @_translated
    async def find_event(self, tenant: str, thread_id: str, event_key: str) -> int | None:
        return await RecordsRepo.find_event(self._conn, tenant, thread_id, event_key)

    @_translated
    async def find_dead_letter(self, tenant: str, thread_id: str, event_key: str) -> tuple[str, str] | None:
        return await DeadLettersRepo.find(self._conn, tenant, thread_id, event_key)

    @_translated
    async def find_event_outcome(self, tenant: str, thread_id: str, event_key: str) -> EventOutcome:
        return await RecordsRepo.find_event_outcome(self._conn, tenant, thread_id, event_key)

    @_translated
    async def select_evidence(
        self, session_id: str, refs: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], EvidenceRow]:
        return await RecordsRepo.select_evidence(self._conn, session_id, refs)

    @_translated
    async def totals(self, thread_id: str) -> tuple[int, int]:
        return await RecordsRepo.totals(self._conn, thread_id)

    @_translated
    async def select_links(self, thread_id: str) -> list[ChainLink]:
        return await RecordsRepo.select_links(self._conn, thread_id)

    @_translated
    async def select_tail(self, thread_id: str, *, limit: int, preview_chars: int) -> list[TailRecord]:
        return await RecordsRepo.select_tail(self._conn, thread_id, limit=limit, preview_chars=preview_chars)

    @_translated
    async def select_full(
        self, thread_id: str
    ) -> list[tuple[int, str, str, dict[str, object], str, str | None]]:
        return await RecordsRepo.select_full(self._conn, thread_id)

    @_translated
    async def open_call_ids(self, thread_id: str) -> list[str]:
        return await HeadsRepo.open_call_ids(self._conn, thread_id)

    @_translated
    async def count_dead_letters(self, thread_id: str) -> int:
        return await DeadLettersRepo.count(self._conn, thread_id)

    @_translated
    async def recent_dead_letters(self, thread_id: str, limit: int) -> list[InspectedDeadLetter]:
        return await DeadLettersRepo.recent(self._conn, thread_id, limit)

    @_translated
    async def summary_count(self, thread_id: str) -> int:
        return await ViewsRepo.summary_count(self._conn, thread_id)

    @_translated
    async def read_calibration(self, tenant: str, profile: str) -> Calibration:
        return await CalibrationsRepo.get(self._conn, tenant, profile)

    @_translated
    async def update_calibration(
        self, tenant: str, profile: str, rule: Callable[[Calibration], Calibration]
    ) -> Calibration:
        return await CalibrationsRepo.update(self._conn, tenant, profile, rule)

    @_translated
    async def note_overflow(self, thread_id: str, profile: str, overflow: ProviderOverflow) -> bool:
        return await CalibrationsRepo.note_overflow(self._conn, thread_id, profile, overflow)


class PgStore:
    """The store over one pool; sessions borrow a connection each, one-shot queries borrow their own."""

    def __init__(self, pool: asyncpg.Pool, *, summary_cache_bytes: int = DEFAULT_SUMMARY_CACHE_BYTES) -> None:
        self._pool = pool
        # Summaries are immutable by id, and this pool reads one database (services/store/views.py).
        self._summaries = SummaryRows(summary_cache_bytes)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[PgConnection]:
        """A connection for a unit of work; a refused acquire is StoreUnavailable too."""
        with translate_pg_errors():
            async with self._pool.acquire() as conn:
                yield PgConnection(conn, self._summaries)

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Conn]:
        with translate_pg_errors():
            async with self._pool.acquire() as conn:
                yield conn

    async def session_inspection(self, tenant: str, session_id: str) -> SessionInspection | None:
        async with self._conn() as conn:
            return await queries.select_session(conn, tenant, session_id)

    async def list_sessions(self, tenant: str | None, limit: int) -> list[listing.SessionListing]:
        async with self._conn() as conn:
            return await listing.select_sessions(conn, tenant, limit)

    async def thread_compactions(self, thread_id: str) -> list[listing.CompactionEntry]:
        async with self._conn() as conn:
            return await listing.select_compactions(conn, thread_id)

    async def thread_served(self, thread_id: str) -> list[listing.ServedStep]:
        async with self._conn() as conn:
            return await listing.select_served(conn, thread_id)

    async def served_texts(self, thread_id: str, digests: Sequence[str]) -> dict[str, str]:
        async with self._conn() as conn:
            return await listing.select_served_texts(conn, thread_id, digests)

    async def thread_tool_calls(self, thread_id: str) -> list[listing.ToolCallEntry]:
        async with self._conn() as conn:
            return await listing.select_tool_calls(conn, thread_id)

    async def receipt(
        self, tenant: str, session_id: str, operation_id: str, principal_id: str | None
    ) -> Receipt | None:
        async with self._conn() as conn:
            return await queries.select_receipt(conn, tenant, session_id, operation_id, principal_id)

    async def session_blob(
        self, tenant: str, session_id: str, sha256: str, principal_id: str | None
    ) -> bytes | None:
        async with self._conn() as conn:
            return await queries.select_session_blob(conn, tenant, session_id, sha256, principal_id)

    async def session_record(
        self, tenant: str, session_id: str, thread_id: str, seq: int, principal_id: str | None
    ) -> EvidenceRow | None:
        async with self._conn() as conn:
            return await queries.select_session_record(conn, tenant, session_id, thread_id, seq, principal_id)

    async def search(self, tenant: str, request: SearchRequest) -> tuple[SearchHit, ...] | None:
        async with self._conn() as conn:
            return await search_sql.search_session(conn, tenant, request)

    async def register_catalog(self, tenant: str, catalog: ToolCatalog) -> int:
        async with self._conn() as conn:
            return await queries.insert_catalog(conn, tenant, catalog)

    async def register_hooks(self, tenant: str, hooks: HookSet) -> int:
        async with self._conn() as conn:
            return await hooks_sql.insert_hooks(conn, tenant, hooks)

    async def session_hooks(self, tenant: str, session_id: str) -> tuple[bool, hooks_sql.PinnedHooks | None]:
        async with self._conn() as conn:
            return await hooks_sql.select_session_hooks(conn, tenant, session_id)

    async def ping(self) -> None:
        """One round trip (readiness): StoreUnavailable if the server does not answer."""
        async with self._conn() as conn:
            await conn.fetchval("SELECT 1")

    async def read_only(self) -> bool:
        """Whether a new transaction could not write (a standby, ``default_transaction_read_only``);
        one round trip, so readiness asks this instead of ``ping``."""
        async with self._conn() as conn:
            return bool(await conn.fetchval("SELECT current_setting('transaction_read_only') = 'on'"))

    async def register_policy(self, tenant: str, policy: ContextPolicy) -> int:
        async with self._conn() as conn:
            return await PoliciesRepo.register(conn, tenant, policy)

    async def index_next(
        self, thread_id: str, *, batch: int, version: int, chunker: search_sql.Chunker
    ) -> search_sql.IndexStep:
        async with self._conn() as conn:
            return await search_sql.index_next(conn, thread_id, batch=batch, version=version, chunker=chunker)

    async def stale_index_threads(self, limit: int, version: int) -> list[str]:
        async with self._conn() as conn:
            return await search_sql.stale_index_threads(conn, limit, version)

    async def reset_index(self, session_id: str | None) -> list[str]:
        async with self._conn() as conn:
            return await search_sql.reset_index(conn, session_id)

    async def stale_views(self, limit: int) -> list[str]:
        """Threads recorded past what the budgeter evaluated (its catch-up after missed notices)."""
        async with self._conn() as conn:
            return await ViewsRepo.stale_threads(conn, limit)

    async def position(self, consumer: str, partition: int) -> int:
        """The last stream sequence ``consumer`` applied on ``partition``, 0 if none."""
        async with self._conn() as conn:
            return await TrackingRepo.max_tracking_seq(conn, consumer, partition)

    async def positions(self, consumer: str, stream: str) -> Positions:
        """Every partition's position and the stream identity they were read from, as one snapshot."""
        async with self._conn() as conn:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await TrackingRepo.select_positions(conn, consumer, stream)

    async def adopt_stream(self, stream: str, created: datetime, *, replacing: datetime | None) -> bool:
        """Record ``created`` as the stream's identity if it is still ``replacing``; whether it was."""
        async with self._conn() as conn:
            return await TrackingRepo.adopt_stream(conn, stream, created, replacing=replacing)

    @asynccontextmanager
    async def locked_positions(self, consumer: str, stream: str) -> AsyncIterator[LockedPositions]:
        """The positions, locked until the block ends: lower them or adopt a stream inside it.

        Nothing commits if the block raises; a recorder that has not halted yet cannot advance a
        position between the read and the write.
        """
        async with self._conn() as conn:
            async with conn.transaction():
                with translate_pg_errors():
                    current = await TrackingRepo.select_positions(conn, consumer, stream, for_update=True)
                yield LockedPositions(conn, consumer, stream, current)


class LockedPositions:
    """Positions read ``FOR UPDATE`` in an open transaction (see ``PgStore.locked_positions``)."""

    def __init__(self, conn: Conn, consumer: str, stream: str, positions: Positions) -> None:
        self._conn, self._consumer, self._stream = conn, consumer, stream
        self.positions = positions

    async def lower(self, created: datetime, resets: Sequence[PositionReset]) -> bool:
        """Move positions back as a re-baseline says; ``False`` if one is no longer what was read."""
        with translate_pg_errors():
            return await TrackingRepo.reset_positions(
                self._conn, self._consumer, self._stream, created, resets
            )

    async def adopt(self, created: datetime) -> bool:
        """Record ``created`` as the stream's identity, replacing the one read with the positions."""
        with translate_pg_errors():
            return await TrackingRepo.adopt_stream(
                self._conn, self._stream, created, replacing=self.positions.created
            )


if TYPE_CHECKING:
    # Checked by mypy: the PostgreSQL store implements every port.
    def _implements(
        store: PgStore,
    ) -> tuple[
        RecordingStore,
        PrepareStore,
        BudgetStore,
        CompactionStore,
        QueryStore,
        IndexStore,
        BranchStore,
        ListingStore,
    ]:
        return store, store, store, store, store, store, store, store
