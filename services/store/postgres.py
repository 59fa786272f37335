"""The PostgreSQL store: the ports of ``ports.py`` over an asyncpg pool.

Every method runs under ``translate_pg_errors`` (acquiring a connection and opening a transaction
too), so what leaves this module is a fleet error, never a driver type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import asyncpg


from services.core.baseline import PositionReset, Positions
from services.core.ledger import BatchPlan
from services.store import batches, branches, calibration, ledger, listing, queries, tracking, windows
from services.store import hook_sets as hooks_sql
from services.store import search as search_sql
from services.store import views as views_sql
from services.store._errors import translate_pg_errors
from services.store.batch_write import LedgerWritten, Position
from services.store.ledger import Conn
from services.store.thread_at_head import ThreadAtHead, read_thread_at_head
from services.store.tracking import TrackingRepo
from services.store.views import DEFAULT_SUMMARY_CACHE_BYTES, SummaryRows, ViewState

if TYPE_CHECKING:
    from services.store.ports import (
        BranchStore,
        ViewStore,
        IndexStore,
        ListingStore,
        PrepareStore,
        QueryStore,
        RecordingStore,
    )

__all__ = ["LockedPositions", "PgConnection", "PgStore"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _on_conn(
    query: Callable[Concatenate[Conn, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[PgConnection, _P], Coroutine[Any, Any, _T]]:
    """A ``PgConnection`` method that runs ``query`` on its connection, its errors translated."""

    async def run(self: PgConnection, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        with translate_pg_errors():
            return await query(self._conn, *args, **kwargs)

    return run


def _pooled(
    query: Callable[Concatenate[Conn, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[PgStore, _P], Coroutine[Any, Any, _T]]:
    """A ``PgStore`` method that runs ``query`` on a connection of its own from the pool."""

    async def run(self: PgStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        async with self._conn() as conn:
            return await query(conn, *args, **kwargs)

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
    max_tracking_seq = _on_conn(TrackingRepo.max_tracking_seq)
    insert_tracking = _on_conn(TrackingRepo.insert_tracking)
    read_for_batch = _on_conn(batches.read_for_batch)
    insert_dead_letter = _on_conn(tracking.insert_dead_letter)

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
        with translate_pg_errors():
            return await batches.write_plan(
                self._conn,
                plan,
                recorded_by=recorded_by,
                keep_raw=keep_raw,
                position=position,
                before_commit=before_commit,
            )

    # Views.
    select_head = _on_conn(ledger.select_head)
    scope_of = _on_conn(views_sql.scope_of)
    select_records = _on_conn(ledger.select_records)
    select_inherited = _on_conn(ledger.select_inherited)
    select_refs = _on_conn(ledger.select_refs)
    summary_chain = _on_conn(views_sql.summary_chain)
    current_window = _on_conn(windows.current_window)
    windows_closed_after = _on_conn(windows.windows_closed_after)
    commit_window = _on_conn(windows.commit_window)
    candidates = _on_conn(views_sql.candidates)
    adopt = _on_conn(views_sql.adopt)
    session_policy = _on_conn(views_sql.session_policy)
    get_policy = _on_conn(views_sql.get_policy)
    read_states = _on_conn(batches.read_states)
    read_session_catalog = _on_conn(batches.read_session_catalog)
    ensure_view = _on_conn(views_sql.ensure_view)
    note_prepare_budget = _on_conn(views_sql.note_prepare_budget)
    set_pending = _on_conn(views_sql.set_pending)
    clear_pending = _on_conn(views_sql.clear_pending)
    mark_evaluated = _on_conn(views_sql.mark_evaluated)
    record_attempt = _on_conn(views_sql.record_attempt)
    commit_summary = _on_conn(views_sql.commit_summary)

    async def thread_at_head(
        self,
        thread_id: str,
        *,
        facts_of_revision: int | None = None,
        records_after: int | None = None,
        event_key: str | None = None,
    ) -> ThreadAtHead | None:
        with translate_pg_errors():
            return await read_thread_at_head(
                self._conn,
                thread_id,
                self._summaries,
                facts_of_revision=facts_of_revision,
                records_after=records_after,
                event_key=event_key,
            )

    async def load_view(self, thread_id: str) -> ViewState:
        with translate_pg_errors():
            return await views_sql.load_view(self._conn, thread_id, self._summaries)

    # Branches (forks and exports).
    select_fork = _on_conn(branches.select_fork)
    select_fork_parent = _on_conn(branches.select_fork_parent)
    insert_fork = _on_conn(branches.insert_fork)
    last_reset = _on_conn(branches.last_reset)
    select_history = _on_conn(branches.select_history)

    # Prepares and inspections.
    find_event_outcome = _on_conn(ledger.find_event_outcome)
    select_evidence = _on_conn(ledger.select_evidence)
    totals = _on_conn(ledger.totals)
    select_links = _on_conn(ledger.select_links)
    select_tail = _on_conn(ledger.select_tail)
    select_full = _on_conn(ledger.select_full)
    open_call_ids = _on_conn(ledger.open_call_ids)
    count_dead_letters = _on_conn(tracking.count_dead_letters)
    recent_dead_letters = _on_conn(tracking.recent_dead_letters)
    summary_count = _on_conn(views_sql.summary_count)
    read_calibration = _on_conn(calibration.read_calibration)
    update_calibration = _on_conn(calibration.update_calibration)
    note_overflow = _on_conn(calibration.note_overflow)


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

    session_inspection = _pooled(queries.select_session)
    receipt = _pooled(queries.select_receipt)
    session_blob = _pooled(queries.select_session_blob)
    session_record = _pooled(queries.select_session_record)
    register_catalog = _pooled(queries.insert_catalog)
    register_policy = _pooled(views_sql.register_policy)
    search = _pooled(search_sql.search_session)
    list_sessions = _pooled(listing.select_sessions)
    thread_compactions = _pooled(listing.select_compactions)
    thread_served = _pooled(listing.select_served)
    served_texts = _pooled(listing.select_served_texts)
    thread_tool_calls = _pooled(listing.select_tool_calls)
    register_hooks = _pooled(hooks_sql.insert_hooks)
    session_hooks = _pooled(hooks_sql.select_session_hooks)
    index_next = _pooled(search_sql.index_next)
    stale_index_threads = _pooled(search_sql.stale_index_threads)
    reset_index = _pooled(search_sql.reset_index)
    stale_views = _pooled(views_sql.stale_threads)
    position = _pooled(TrackingRepo.max_tracking_seq)
    adopt_stream = _pooled(TrackingRepo.adopt_stream)

    async def ping(self) -> None:
        """One round trip (readiness): StoreUnavailable if the server does not answer."""
        async with self._conn() as conn:
            await conn.fetchval("SELECT 1")

    async def read_only(self) -> bool:
        """Whether a new transaction could not write (a standby, ``default_transaction_read_only``);
        one round trip, so readiness asks this instead of ``ping``."""
        async with self._conn() as conn:
            return bool(await conn.fetchval("SELECT current_setting('transaction_read_only') = 'on'"))

    async def positions(self, consumer: str, stream: str) -> Positions:
        """Every partition's position and the stream identity they were read from, as one snapshot."""
        async with self._conn() as conn:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await TrackingRepo.select_positions(conn, consumer, stream)

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
    ) -> tuple[RecordingStore, PrepareStore, ViewStore, QueryStore, IndexStore, BranchStore, ListingStore]:
        return store, store, store, store, store, store, store
