"""What the services need from the store, as ports: PostgreSQL (``postgres.PgStore``) and memory
(``memory.MemoryStore``) both implement them, and raise the same typed errors.

A service opens a session (one connection's worth of work) from its store; the store translates its
own driver errors, so a port never surfaces a driver type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeAlias, TypeVar

from contracts import (
    ContextPolicy,
    InspectedDeadLetter,
    InspectedRecord,
    Receipt,
    SearchHit,
    SearchRequest,
    SessionInspection,
    ToolCatalog,
)
from contracts.hooks import AdditionCategory
from contracts.hooks import HookSet
from contracts.prepare import ProviderOverflow
from contracts.windows import WindowHandoff

from services.core.calibration import Calibration

from services.core.compaction.policy import Throttle
from services.core.gateway_check import GatewayRecord
from services.core.served import ServedContext
from services.core.hashing import ChainLink
from services.core.ledger import BatchKeys, BatchPlan, LedgerReads, Rejection
from services.core.records import LedgerRecord
from services.core.state import StateView
from services.store.final_checks import StoredCheck
from services.store.batch_write import LedgerWritten, Position
from services.store.branches import ForkOrigin, ForkParent, HistoryRow, NewFork
from services.store.hook_sets import PinnedHooks
from services.store.ledger import EventOutcome, EvidenceRow, FullRecord, StoredHead
from services.store.listing import CompactionEntry, ServedStep, SessionListing, ToolCallEntry
from services.store.search import Chunker, IndexStep
from services.store.views import Candidate, NewSummary, SummaryRow, ThreadScope, ViewState
from services.store.thread_at_head import ThreadAtHead
from services.store.windows import OpenWindow

__all__ = [
    "GatewayStore",
    "HookGrants",
    "BranchConnection",
    "BranchStore",
    "BudgetStore",
    "CompactionStore",
    "FullRecord",
    "HookStore",
    "IndexStore",
    "ListingStore",
    "LedgerWritten",
    "Position",
    "PrepareConnection",
    "PrepareStore",
    "QueryStore",
    "RecordingConnection",
    "RecordingStore",
    "Sessions",
    "Transactional",
    "ViewConnection",
    "ViewReads",
    "ViewStore",
    "ViewWrites",
]


class Transactional(Protocol):
    """A session whose writes can be grouped."""

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """Everything in the block commits together or not at all."""
        ...


class RecordingConnection(Transactional, Protocol):
    """What the recorder reads and writes per batch."""

    async def max_tracking_seq(self, consumer: str, partition: int) -> int: ...

    async def insert_tracking(self, consumer: str, partition: int, stream_seq: int) -> None: ...

    async def read_for_batch(
        self, wanted: BatchKeys, tracking: tuple[str, int] | None = None
    ) -> LedgerReads: ...

    async def write_plan(
        self,
        plan: BatchPlan,
        *,
        recorded_by: str,
        keep_raw: int,
        position: Position | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> LedgerWritten:
        """Apply a plan, all of it or none, and move ``position`` with it (RevisionConflict on a moved
        head, DuplicateEvent on a key recorded meanwhile); it commits by itself unless the caller holds
        a transaction. ``before_commit`` runs once, when the writes are in and not yet committed."""
        ...

    async def insert_dead_letter(self, rejection: Rejection, *, keep_raw: int) -> None: ...


class ViewReads(Protocol):
    """What loading a thread's view reads (``services.app.views.ViewLoader``), plus adopting a summary."""

    async def select_head(self, thread_id: str) -> StoredHead | None: ...

    async def thread_at_head(
        self,
        thread_id: str,
        *,
        facts_of_revision: int | None = None,
        records_after: int | None = None,
        event_key: str | None = None,
    ) -> ThreadAtHead | None:
        """The head with its scope, compaction state and open window, read at one instant; its current
        facts too unless the head is still at ``facts_of_revision``, its records after seq
        ``records_after`` up to the head when that is given, and what became of ``event_key`` in the
        thread (for the thread's tenant) when that is."""
        ...

    async def scope_of(self, thread_id: str) -> ThreadScope: ...

    async def select_records(self, thread_id: str, *, gt: int, lte: int) -> list[LedgerRecord]: ...

    async def select_inherited(
        self, session_id: str, *, after: int, through: int, exclude_thread: str
    ) -> list[LedgerRecord]: ...

    async def select_refs(self, refs: Sequence[tuple[str, int]]) -> list[LedgerRecord]: ...

    async def select_fork(self, session_id: str) -> ForkOrigin | None:
        """Where a forked session branched from (``None`` for a session that is no fork)."""
        ...

    async def load_view(self, thread_id: str) -> ViewState: ...

    async def summary_chain(self, summary_id: str) -> list[tuple[int, SummaryRow]]:
        """The summaries ``summary_id`` extends, each with the view revision it was committed at,
        its parent first."""
        ...

    async def current_window(self, thread_id: str) -> OpenWindow | None: ...

    async def windows_closed_after(self, thread_id: str) -> list[int]: ...

    async def candidates(self, session_id: str, thread_id: str, through: int) -> list[Candidate]: ...

    async def adopt(self, thread_id: str, expected_revision: int, candidate: Candidate) -> bool: ...

    async def session_policy(self, session_id: str) -> tuple[str, str, int] | None: ...

    async def get_policy(
        self, tenant: str, name: str, revision: int | None = None
    ) -> tuple[int, ContextPolicy] | None: ...

    async def read_states(self, thread_ids: Sequence[str]) -> dict[str, StateView]: ...

    async def read_session_catalog(self, session_id: str) -> ToolCatalog | None: ...

    async def read_calibration(self, tenant: str, profile: str) -> Calibration: ...


class ViewWrites(Protocol):
    """The compaction state of a thread's view: the pending-job slot, attempts, commits."""

    async def ensure_view(self, thread_id: str) -> None: ...

    async def note_prepare_budget(self, thread_id: str, budget: int, reserved: int) -> None: ...

    async def set_pending(self, thread_id: str, fingerprint: str, *, stale_after_s: float) -> bool: ...

    async def clear_pending(self, thread_id: str, fingerprint: str) -> None: ...

    async def mark_evaluated(self, thread_id: str, head_revision: int) -> None: ...

    async def record_attempt(
        self,
        thread_id: str,
        *,
        throttle: Throttle | None,
        reason: str | None,
        failed: bool,
        fingerprint: str | None,
        counts_as_attempt: bool = True,
    ) -> None: ...

    async def commit_summary(self, expected_revision: int, summary: NewSummary) -> str:
        """The new summary's id; RevisionConflict if the view is no longer at ``expected_revision``."""
        ...

    async def commit_window(self, expected_view_revision: int, handoff: WindowHandoff, tokens: int) -> int:
        """Commit ``handoff`` and open its window in one transaction; ``RevisionConflict`` if the view
        moved from ``expected_view_revision``."""
        ...


class PrepareConnection(Transactional, ViewReads, ViewWrites, Protocol):
    """What a prepare and an inspection read."""

    async def find_event_outcome(self, tenant: str, thread_id: str, event_key: str) -> EventOutcome:
        """Where the event was recorded in a thread of ``tenant`` (with the record's content hash), or
        else its newest dead letter's code and reason: in one round trip."""
        ...

    async def select_evidence(
        self, session_id: str, refs: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], EvidenceRow]: ...

    async def totals(self, thread_id: str) -> tuple[int, int]: ...

    async def select_links(self, thread_id: str) -> list[ChainLink]: ...

    async def select_tail(
        self, thread_id: str, *, limit: int, preview_chars: int
    ) -> list[InspectedRecord]: ...

    async def select_full(self, thread_id: str) -> list[FullRecord]: ...

    async def open_call_ids(self, thread_id: str) -> list[str]: ...

    async def count_dead_letters(self, thread_id: str) -> int: ...

    async def recent_dead_letters(self, thread_id: str, limit: int) -> list[InspectedDeadLetter]: ...

    async def summary_count(self, thread_id: str) -> int: ...

    async def update_calibration(
        self, tenant: str, profile: str, rule: Callable[[Calibration], Calibration]
    ) -> Calibration:
        """The calibration after ``rule``, applied atomically to the stored one."""
        ...

    async def note_overflow(self, thread_id: str, profile: str, overflow: ProviderOverflow) -> bool:
        """Remember a provider overflow on the view it names; False if that view already had one."""
        ...


class ViewConnection(ViewReads, ViewWrites, Protocol):
    """What the budgeter and the compactor read and write."""


class BranchConnection(Transactional, Protocol):
    """What forking and exporting a session read and write."""

    async def select_fork(self, session_id: str) -> ForkOrigin | None: ...

    async def select_fork_parent(self, tenant: str, session_id: str) -> ForkParent | None: ...

    async def insert_fork(self, fork: NewFork) -> bool:
        """Create the fork's session; False if its id is already used."""
        ...

    async def last_reset(self, session_id: str, through: int) -> int: ...

    async def select_history(
        self, session_id: str, *, after: int, through: int, limit: int
    ) -> list[HistoryRow]: ...


_Connection = TypeVar("_Connection", covariant=True)


class Sessions(Protocol[_Connection]):
    """A store that opens sessions of one port."""

    def connection(self) -> AbstractAsyncContextManager[_Connection]:
        """One connection's worth of work (acquiring it may raise StoreUnavailable)."""
        ...


BranchStore: TypeAlias = Sessions[BranchConnection]
RecordingStore: TypeAlias = Sessions[RecordingConnection]
PrepareStore: TypeAlias = Sessions[PrepareConnection]
# The budgeter's and the compactor's store: both keep threads' views.
ViewStore: TypeAlias = Sessions[ViewConnection]
BudgetStore: TypeAlias = ViewStore
CompactionStore: TypeAlias = ViewStore


class QueryStore(Protocol):
    """Requests answered straight from the store (no view involved)."""

    async def session_inspection(self, tenant: str, session_id: str) -> SessionInspection | None: ...

    async def receipt(
        self, tenant: str, session_id: str, operation_id: str, principal_id: str | None
    ) -> Receipt | None: ...

    async def session_blob(
        self, tenant: str, session_id: str, sha256: str, principal_id: str | None
    ) -> bytes | None: ...

    async def session_record(
        self, tenant: str, session_id: str, thread_id: str, seq: int, principal_id: str | None
    ) -> EvidenceRow | None: ...

    async def search(self, tenant: str, request: SearchRequest) -> tuple[SearchHit, ...] | None: ...

    async def register_catalog(self, tenant: str, catalog: ToolCatalog) -> int: ...

    async def register_policy(self, tenant: str, policy: ContextPolicy) -> int: ...


class HookStore(Protocol):
    """Context hook sets per agent release."""

    async def register_hooks(self, tenant: str, hooks: HookSet) -> int:
        """Store ``hooks`` as the next revision of its release in ``tenant``; returns the revision."""
        ...

    async def session_hooks(self, tenant: str, session_id: str) -> tuple[bool, PinnedHooks | None]:
        """Whether ``tenant`` has the session recorded, and the hook set revision its release had
        registered when the session's first event was recorded (``None``: none then)."""
        ...


class ListingStore(Protocol):
    """What the operator console lists beside the inspections (read-only, across tenants)."""

    async def list_sessions(self, tenant: str | None, limit: int) -> list[SessionListing]: ...

    async def thread_compactions(self, thread_id: str) -> list[CompactionEntry]: ...

    async def thread_tool_calls(self, thread_id: str) -> list[ToolCallEntry]: ...

    async def thread_served(self, thread_id: str) -> list[ServedStep]:
        """The contexts the fleet answered the thread (still kept), oldest step first."""
        ...

    async def served_texts(self, thread_id: str, digests: Sequence[str]) -> dict[str, str]:
        """The texts of the thread's served blocks with these digests."""
        ...


class IndexStore(Protocol):
    """The search index's positions and chunks."""

    async def index_next(self, thread_id: str, *, batch: int, version: int, chunker: Chunker) -> IndexStep:
        """Index up to ``batch`` records after the thread's position; a record whose content the
        store refuses is skipped (named in the step), never raised: it would fail every time."""
        ...

    async def stale_index_threads(self, limit: int, version: int) -> list[str]: ...

    async def reset_index(self, session_id: str | None) -> list[str]: ...


class GatewayStore(Protocol):
    """What the gateway's final check keeps: prepared-context records and one verdict per attempt."""

    async def insert_prepared(self, record: GatewayRecord) -> None: ...

    async def insert_prepared_many(self, records: Sequence[GatewayRecord]) -> None:
        """Keep each of ``records`` in one statement; ids already stored are left as they are."""
        ...

    async def insert_served_many(
        self, served: Sequence[ServedContext], texts: Sequence[tuple[str, str, str, str]]
    ) -> None:
        """Keep served manifests (once per id and format) and ``(thread, digest, tenant, text)``s."""
        ...

    async def select_prepared(self, prepared_id: str, format: str) -> GatewayRecord | None: ...

    async def insert_check(self, stored: StoredCheck) -> StoredCheck:
        """Record a verdict once per ``(prepared_id, attempt)``; answers the one recorded first."""
        ...

    async def select_check(self, prepared_id: str, attempt: int) -> StoredCheck | None: ...

    async def has_reprepare(self, prepared_id: str) -> bool: ...


class HookGrants(Protocol):
    """The addition categories each hook of a session's release was granted (``HookBinding.grants``)."""

    async def granted(self, tenant: str, session_id: str) -> Mapping[str, frozenset[AdditionCategory]]:
        """Per hook source (``name@version``), what it may add; a source not named may add nothing."""
        ...
