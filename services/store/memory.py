"""An in-memory store: the recording, view, prepare, budget and compaction ports without a server.

It keeps the tables PostgreSQL keeps, as dicts, and raises what ``PgStore`` raises for the same
writes (``RevisionConflict`` on a moved head or view, ``DuplicateEvent`` on a key recorded meanwhile,
``StoreRejected`` for a value the schema refuses), so the services' shells can be tested without
PostgreSQL and the two are held to one contract (tests/contract). A transaction is a snapshot of
the tables, restored when its block raises. Single event loop only; not for production.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

from contracts import (
    DEFAULT_POLICY_NAME,
    ContextPolicy,
    InspectedDeadLetter,
    InspectedRecord,
    SearchHit,
    SearchRequest,
    ToolCatalog,
)
from contracts.hooks import HookSet
from contracts.prepare import ProviderOverflow
from contracts.windows import WindowHandoff
from contracts.subjects import DEFAULT_TENANT, parse_stored_subject

from services.core.calibration import Calibration

from services.core.compaction.policy import Throttle
from contracts.exceptions import DuplicateEvent, RevisionConflict
from services.core.hashing import ChainLink, sha256_hex
from services.killpoints import kill_point
from services.core.ledger import (
    BatchKeys,
    BatchPlan,
    CallState,
    HeadWrite,
    KnownKey,
    LedgerReads,
    Rejection,
    ThreadHead,
    encode_raw,
)
from services.core.records import LedgerRecord
from services.core.runs import RunState, ThreadMeta
from services.core.state import Fact, StateView
from contracts.exceptions import StoreRejected
from services.store._errors import race_conflict
from services.store.batch_write import LedgerWritten, Position
from services.store.branches import ForkOrigin, ForkParent, HistoryRow, NewFork, history_of_row
from services.store.final_checks import MemoryGatewayStore
from services.store.hook_sets import PinnedHooks
from services.store.ledger import (
    EventOutcome,
    EvidenceRow,
    FullRecord,
    StoredHead,
    _ledger_record,
    blob_preview,
    evidence_of_row,
    head_of_row,
)
from services.store.memory_search import MemoryIndex
from services.store.search import Chunker, IndexStep
from services.store.listing import (
    CompactionEntry,
    ServedStep,
    SessionListing,
    ToolCallEntry,
    compaction_of_row,
)
from services.store.views import (
    Candidate,
    NewSummary,
    SummaryRow,
    ThreadScope,
    scope_of_row,
    summary_of_row,
    view_of_row,
    ViewState,
    summary_hooks_json,
    summary_id_of,
)
from services.store.thread_at_head import ThreadAtHead
from services.store.windows import OpenWindow

if TYPE_CHECKING:
    from services.store.ports import (
        BranchStore,
        ViewStore,
        ListingStore,
        PrepareStore,
        RecordingStore,
    )

__all__ = ["MemoryConnection", "MemoryStore"]

_Row = dict[str, Any]


@dataclass
class _Tables:
    sessions: dict[str, _Row] = field(default_factory=dict)
    policies: dict[tuple[str, str, int], ContextPolicy] = field(default_factory=dict)
    heads: dict[str, _Row] = field(default_factory=dict)
    records: dict[tuple[str, int], _Row] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    runs: dict[str, _Row] = field(default_factory=dict)
    calls: dict[tuple[str, str], _Row] = field(default_factory=dict)
    dead_letters: list[_Row] = field(default_factory=list)
    tracking: dict[tuple[str, int], int] = field(default_factory=dict)
    facts: dict[tuple[str, str], Fact] = field(default_factory=dict)
    versions: dict[tuple[str, str], int] = field(default_factory=dict)
    proposals: list[_Row] = field(default_factory=list)
    catalogs: dict[tuple[str, str, int], ToolCatalog] = field(default_factory=dict)
    # A hook revision, with the sessions recorded before it (they keep the revision they had).
    hooks: dict[tuple[str, str, int], tuple[HookSet, frozenset[str]]] = field(default_factory=dict)
    receipts: dict[tuple[str, str], _Row] = field(default_factory=dict)
    views: dict[str, _Row] = field(default_factory=dict)
    summaries: dict[str, _Row] = field(default_factory=dict)
    calibrations: dict[tuple[str, str], Calibration] = field(default_factory=dict)
    overflows: dict[tuple[str, int], ProviderOverflow] = field(default_factory=dict)
    forks: dict[str, ForkOrigin] = field(default_factory=dict)
    windows: dict[tuple[str, int], _Row] = field(default_factory=dict)
    handoffs: dict[str, _Row] = field(default_factory=dict)
    # The search index (chunks, positions), and the records whose facts a later write superseded.
    search: MemoryIndex = field(default_factory=MemoryIndex)
    retired: set[tuple[str, int]] = field(default_factory=set)
    # Insertion order stands in for created_at / updated_at.
    clock: int = 0

    def tick(self) -> int:
        self.clock += 1
        return self.clock


def _next_revision(table: Mapping[tuple[str, str, int], object], tenants: tuple[str, ...], name: str) -> int:
    """The revision after the newest of ``name`` of ``tenants`` in a table keyed ``(tenant, name, rev)``."""
    return 1 + max((r for (t, n, r) in table if t in tenants and n == name), default=0)


def _unique_violation(constraint: str) -> StoreRejected:
    """What the server raises for a duplicate under a unique constraint outside the race set."""
    return StoreRejected(
        "UniqueViolationError", "23505", f'duplicate key value violates unique constraint "{constraint}"'
    )


def _as_timestamptz(ts: datetime | None) -> datetime | None:
    """What a ``timestamptz`` column gives back: the instant in UTC (asyncpg, like ``astimezone``,
    takes a naive time as local)."""
    return None if ts is None else ts.astimezone(timezone.utc)


def _new_view(thread_id: str) -> _Row:
    return {
        "thread_id": thread_id,
        "view_revision": 0,
        "summary_id": None,
        "covered_to": 0,
        "baseline_user_turns": 0,
        "baseline_model_steps": 0,
        "baseline_watermark": 0,
        "evaluated_revision": 0,
        "pending_fingerprint": None,
        "pending_since": None,
        "throttle": None,
        "deferred_reason": None,
        "attempts": 0,
        "failures": 0,
        "last_failure": None,
        "prepare_budget": None,
        "prepare_reserved": 0,
    }


class MemoryStore:
    """The tables, shared by every session opened on it."""

    def __init__(
        self,
        *,
        now: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        gateway: MemoryGatewayStore | None = None,
    ) -> None:
        self.tables = _Tables()
        # The gateway's tables of this same database (its served history is listed from here).
        self.gateway = gateway if gateway is not None else MemoryGatewayStore()
        self.open_sessions = 0
        self._now = now
        # The fleet's clock for ``recorded_at`` (PostgreSQL's ``now()``): search ranges and runtime.
        self.wall = wall
        # The built-in policy every tenant may use, as the baseline migration seeds it.
        self.tables.policies[("", DEFAULT_POLICY_NAME, 1)] = ContextPolicy.model_validate_json(
            '{"schema_version": 1, "name": "default"}'
        )

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[MemoryConnection]:
        """A session on the shared tables (counted in ``open_sessions``, as a pool counts connections)."""
        self.open_sessions += 1
        try:
            yield MemoryConnection(self, self._now)
        finally:
            self.open_sessions -= 1

    async def search(self, tenant: str, request: SearchRequest) -> tuple[SearchHit, ...] | None:
        t = self.tables
        session = t.sessions.get(request.session_id)
        if session is None or session["tenant"] != tenant:
            return None
        if session["principal_id"] is not None and session["principal_id"] != request.principal_id:
            return None
        runs = {tid: h["run_id"] for tid, h in t.heads.items()}
        return t.search.search(request, run_of=runs, superseded=frozenset(t.retired))

    async def index_next(self, thread_id: str, *, batch: int, version: int, chunker: Chunker) -> IndexStep:
        t = self.tables
        rows = [r for (tid, _), r in t.records.items() if tid == thread_id]
        return t.search.index_next(thread_id, rows, t.blobs, batch=batch, version=version, chunker=chunker)

    async def stale_index_threads(self, limit: int, version: int) -> list[str]:
        heads = {tid: int(h["last_seq"]) for tid, h in sorted(self.tables.heads.items())}
        return self.tables.search.stale_threads(heads, limit, version)

    async def reset_index(self, session_id: str | None) -> list[str]:
        threads = sorted(
            tid for tid, h in self.tables.heads.items() if session_id is None or h["session_id"] == session_id
        )
        self.tables.search.drop_threads(threads)
        return threads

    async def register_hooks(self, tenant: str, hooks: HookSet) -> int:
        revision = _next_revision(self.tables.hooks, (tenant,), hooks.release)
        self.tables.hooks[(tenant, hooks.release, revision)] = (hooks, frozenset(self.tables.sessions))
        return revision

    async def session_hooks(self, tenant: str, session_id: str) -> tuple[bool, PinnedHooks | None]:
        t = self.tables
        s = t.sessions.get(session_id)
        if s is None or s["tenant"] != tenant:
            return False, None
        pinned = [
            PinnedHooks(hooks, r)
            for (tn, rel, r), (hooks, before) in t.hooks.items()
            if tn == tenant and rel == s["agent_release"] and session_id not in before
        ]
        return True, max(pinned, key=lambda p: p.revision) if pinned else None

    async def register_policy(self, tenant: str, policy: ContextPolicy) -> int:
        # Numbered across the tenant's own policies and the shared built-ins (tenant ''), as PgStore does.
        revision = _next_revision(self.tables.policies, (tenant, ""), policy.name)
        self.tables.policies[(tenant, policy.name, revision)] = policy
        return revision

    async def register_catalog(self, tenant: str, catalog: ToolCatalog) -> int:
        revision = _next_revision(self.tables.catalogs, (tenant,), catalog.release)
        self.tables.catalogs[(tenant, catalog.release, revision)] = catalog
        return revision

    async def list_sessions(self, tenant: str | None, limit: int) -> list[SessionListing]:
        t = self.tables
        newest = [s for s in reversed(t.sessions.values()) if tenant is None or s["tenant"] == tenant]
        return [
            SessionListing(
                tenant=s["tenant"],
                session_id=s["session_id"],
                principal_id=s["principal_id"],
                agent_release=s["agent_release"],
                policy=f"{s['policy_name']}@{s['policy_revision']}",
                last_seq=s["last_seq"],
                runs=sum(r["session_id"] == s["session_id"] for r in t.runs.values()),
                threads=sum(h["session_id"] == s["session_id"] for h in t.heads.values()),
            )
            for s in newest[:limit]
        ]

    async def thread_compactions(self, thread_id: str) -> list[CompactionEntry]:
        mine = sorted(
            (s for s in self.tables.summaries.values() if s["thread_id"] == thread_id),
            key=lambda s: int(s["view_revision"]),
        )
        return [compaction_of_row(s) for s in mine]

    async def thread_served(self, thread_id: str) -> list[ServedStep]:
        return list(self.gateway.served.get(thread_id, ()))

    async def served_texts(self, thread_id: str, digests: Sequence[str]) -> dict[str, str]:
        texts = self.gateway.served_texts
        return {d: texts[(thread_id, d)] for d in digests if (thread_id, d) in texts}

    async def thread_tool_calls(self, thread_id: str) -> list[ToolCallEntry]:
        mine = sorted(
            ((cid, c) for (tid, cid), c in self.tables.calls.items() if tid == thread_id),
            key=lambda item: (int(item[1]["call_seq"]), item[0]),
        )
        return [
            ToolCallEntry(cid, c["name"], c["call_seq"], c["outcome_seq"], c["status"]) for cid, c in mine
        ]


class MemoryConnection:
    """The ports of ``ports.py`` over a ``MemoryStore``'s tables."""

    def __init__(self, store: MemoryStore, now: Callable[[], float]) -> None:
        self._store = store
        self._now = now

    @property
    def _t(self) -> _Tables:
        return self._store.tables

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """All or nothing: the tables as they were are put back if the block raises."""
        saved = copy.deepcopy(self._store.tables)
        try:
            yield
        except BaseException:
            self._store.tables = saved
            raise

    # Recording.

    async def max_tracking_seq(self, consumer: str, partition: int) -> int:
        return self._t.tracking.get((consumer, partition), 0)

    async def insert_tracking(self, consumer: str, partition: int, stream_seq: int) -> None:
        key = (consumer, partition)
        self._t.tracking[key] = max(self._t.tracking.get(key, 0), stream_seq)

    async def read_for_batch(self, wanted: BatchKeys, tracking: tuple[str, int] | None = None) -> LedgerReads:
        t = self._t
        heads = {
            tid: ThreadHead(
                tid, h["session_id"], h["revision"], h["last_seq"], h["last_hash"], h["last_event_key"]
            )
            for tid in wanted.thread_ids
            if (h := t.heads.get(tid)) is not None
        }
        asked = set(wanted.keys)
        known = {
            (r["thread_id"], r["event_key"]): KnownKey(r["seq"], r["content_sha256"])
            for r in t.records.values()
            if (r["thread_id"], r["event_key"]) in asked
        }
        states = {
            key: CallState(key[1], c["call_seq"], c["outcome_seq"], c["name"], dict(c["args"]))
            for key in wanted.calls
            if (c := t.calls.get(key)) is not None
        }
        sessions = [s for sid in wanted.session_ids if (s := t.sessions.get(sid)) is not None]
        tenant_set = {*wanted.tenants, ""}
        runs: dict[str, RunState] = {}
        active: dict[str, str] = {}
        for r in t.runs.values():
            if r["run_id"] in wanted.run_ids or (
                r["session_id"] in wanted.session_ids and r["status"] == "active"
            ):
                runs[r["run_id"]] = RunState(r["run_id"], r["session_id"], r["status"], r["main_thread_id"])
                if r["status"] == "active":
                    active[r["session_id"]] = r["run_id"]
        metas = {
            tid: ThreadMeta(tid, h["session_id"], h["role"], h["parent_thread_id"], h["last_seq"])
            for tid in {*wanted.thread_ids, *wanted.extra_threads}
            if (h := t.heads.get(tid)) is not None
        }
        catalogs: dict[str, tuple[int, ToolCatalog]] = {}
        for s in sessions:
            pinned = t.catalogs.get((s["tenant"], s["agent_release"], s["catalog_revision"]))
            if pinned is not None:
                catalogs[s["session_id"]] = (s["catalog_revision"], pinned)
        latest: dict[tuple[str, str], tuple[int, ToolCatalog]] = {}
        for (tenant, release, revision), catalog in t.catalogs.items():
            if (tenant, release) in wanted.release_names and revision > latest.get(
                (tenant, release), (0, catalog)
            )[0]:
                latest[(tenant, release)] = (revision, catalog)
        return LedgerReads(
            heads=heads,
            keys=known,
            calls=states,
            sessions={s["session_id"]: s["tenant"] for s in sessions},
            policies=frozenset((tn, n) for (tn, n, _) in t.policies if tn in tenant_set),
            runs=runs,
            active_runs=active,
            threads=metas,
            principals={s["session_id"]: s["principal_id"] for s in sessions},
            releases={s["session_id"]: s["agent_release"] for s in sessions},
            states=await self.read_states(wanted.thread_ids),
            catalogs=catalogs,
            latest_catalogs=latest,
            operations=frozenset(o for o in wanted.operation_ids if o in t.receipts),
            tracked=t.tracking.get(tracking, 0) if tracking is not None else 0,
        )

    async def write_plan(
        self,
        plan: BatchPlan,
        *,
        recorded_by: str,
        keep_raw: int,
        position: Position | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> LedgerWritten:
        """As ``batches.write_plan``: every write of the plan, or none."""
        async with self.transaction():
            written = await self._write_plan(
                plan, recorded_by=recorded_by, keep_raw=keep_raw, position=position
            )
            if before_commit is not None:
                before_commit()
        return written

    async def _write_plan(
        self, plan: BatchPlan, *, recorded_by: str, keep_raw: int, position: Position | None
    ) -> LedgerWritten:
        t = self._t
        if position is not None:
            await self.insert_tracking(position.consumer, position.partition, position.stream_seq)
        bases: dict[str, int] = {}
        for session_id in sorted(plan.session_counts):
            n = plan.session_counts[session_id]
            session = t.sessions.get(session_id)
            if session is None:
                policy = plan.session_policies.get(session_id, DEFAULT_POLICY_NAME)
                tenant = plan.session_tenants.get(session_id, DEFAULT_TENANT)
                revision = max(
                    (r for (tn, nm, r) in t.policies if nm == policy and tn in (tenant, "")), default=None
                )
                if revision is None:
                    raise StoreRejected(
                        "NotNullViolationError", "23502", 'null value in column "policy_revision"'
                    )
                session = t.sessions[session_id] = {
                    "session_id": session_id,
                    "tenant": tenant,
                    "principal_id": None,
                    "agent_release": None,
                    "last_seq": 0,
                    "reset_seq": 0,
                    "policy_name": policy,
                    "policy_revision": revision,
                    "catalog_revision": None,
                }
            session["last_seq"] += n
            bases[session_id] = session["last_seq"] - n
        for session_id, principal in sorted(plan.principals.items()):
            if (s := t.sessions.get(session_id)) is not None and s["principal_id"] is None:
                s["principal_id"] = principal
        for session_id, release in sorted(plan.releases.items()):
            if (s := t.sessions.get(session_id)) is not None and s["agent_release"] is None:
                s["agent_release"] = release
        for head in plan.heads:
            self._write_head(head)
        for thread_id, meta in plan.new_threads.items():
            if (h := t.heads.get(thread_id)) is not None:
                h["role"], h["parent_thread_id"] = meta.role, meta.parent_thread_id
        for blob in plan.blobs:
            t.blobs.setdefault(blob.sha256, blob.content)
        for r in plan.records:
            self._insert_record(r, bases[r.session_id] + r.session_ordinal, recorded_by)
        self._write_runs(plan, bases)
        for c in plan.calls:
            if (c.thread_id, c.call_id) in t.calls:
                # As the server's unique violation on tool_calls_pkey translates: a race.
                raise RevisionConflict(c.thread_id, -1, None)
            t.calls[(c.thread_id, c.call_id)] = {
                "name": c.name,
                "call_seq": c.call_seq,
                "args": json.loads(json.dumps(c.args)),
                "outcome_seq": None,
                "status": None,
            }
        closed = 0
        for o in plan.outcomes:
            call = t.calls.get((o.thread_id, o.call_id))
            if call is not None and call["outcome_seq"] is None:
                call["outcome_seq"], call["status"] = o.outcome_seq, o.status
                closed += 1
        if closed != len(plan.outcomes):
            raise RevisionConflict(plan.outcomes[0].thread_id, -1, None)
        for rejection in plan.rejections:
            await self.insert_dead_letter(rejection, keep_raw=keep_raw)
        self._write_state(plan)
        return LedgerWritten(bases, self._store.wall())

    def _write_head(self, head: HeadWrite) -> None:
        t = self._t
        current = t.heads.get(head.thread_id)
        if head.expected_revision is None:
            if current is None:
                t.heads[head.thread_id] = {
                    "thread_id": head.thread_id,
                    "session_id": head.session_id,
                    "run_id": head.run_id,
                    "instance_id": head.instance_id,
                    "revision": head.revision,
                    "last_seq": head.last_seq,
                    "last_hash": head.last_hash,
                    "last_event_key": head.last_event_key,
                    "user_turns": head.user_turns,
                    "model_steps": head.model_steps,
                    "role": "main",
                    "parent_thread_id": None,
                    "created": t.tick(),
                    "updated": t.clock,
                }
                return
        elif current is not None and current["revision"] == head.expected_revision:
            current.update(
                revision=head.revision,
                last_seq=head.last_seq,
                last_hash=head.last_hash,
                last_event_key=head.last_event_key,
                user_turns=current["user_turns"] + head.user_turns,
                model_steps=current["model_steps"] + head.model_steps,
                updated=t.tick(),
            )
            return
        raise RevisionConflict(
            head.thread_id, head.expected_revision or 0, None if current is None else current["revision"]
        )

    def _insert_record(self, r: Any, session_seq: int, recorded_by: str) -> None:
        t = self._t
        if (r.thread_id, r.seq) in t.records:
            raise race_conflict("?", "records_pkey")
        if any(x["thread_id"] == r.thread_id and x["event_key"] == r.event_key for x in t.records.values()):
            raise DuplicateEvent(f"Key (thread_id, event_key)=({r.thread_id}, {r.event_key}) already exists.")
        if any(
            x["session_id"] == r.session_id and x["session_seq"] == session_seq for x in t.records.values()
        ):
            raise race_conflict("?", "records_session_seq")
        if (r.text is None) == (r.blob_sha256 is None):
            raise StoreRejected(
                "CheckViolationError", "23514", 'new row violates check constraint "records_text_xor_blob"'
            )
        mask = r.mask_tokens
        t.records[(r.thread_id, r.seq)] = {
            "thread_id": r.thread_id,
            "seq": r.seq,
            "session_id": r.session_id,
            "session_seq": session_seq,
            "run_id": r.run_id,
            "instance_id": r.instance_id,
            "event_key": r.event_key,
            "kind": r.kind,
            "payload": r.payload_json,
            "text": r.text,
            "blob_sha256": r.blob_sha256,
            "view_text": r.view_text,
            "tokens_o200k": r.tokens.o200k_base,
            "tokens_cl100k": r.tokens.cl100k_counted,
            "content_sha256": r.content_sha256,
            "prev_hash": r.prev_hash,
            "record_hash": r.record_hash,
            "client_ts": _as_timestamptz(r.client_ts),
            "stream_seq": r.stream_seq,
            "recorded_by": recorded_by,
            "mask_text": r.mask_text,
            "mask_tokens_o200k": mask.o200k_base if mask else None,
            "mask_tokens_cl100k": mask.cl100k_counted if mask else None,
            "recorded_at": self._store.wall(),
        }

    def _write_runs(self, plan: BatchPlan, bases: Mapping[str, int]) -> None:
        t = self._t
        new = {run.run_id for run in plan.new_runs}

        def session_seq_of(thread_id: str, seq: int) -> int:
            record = next(r for r in plan.records if r.thread_id == thread_id and r.seq == seq)
            return bases[record.session_id] + record.session_ordinal

        def set_status(run_id: str, status: str) -> None:
            run = t.runs.get(run_id)
            if run is None:
                return
            if status == "active" and any(
                o["session_id"] == run["session_id"] and o["status"] == "active" and o["run_id"] != run_id
                for o in t.runs.values()
            ):
                raise race_conflict("?", "runs_one_active")
            run["status"] = status

        for run_id, status in plan.run_statuses.items():
            if run_id not in new and status != "active":
                set_status(run_id, status)
        for run in sorted(plan.new_runs, key=lambda r: plan.run_statuses.get(r.run_id, "active") == "active"):
            first = min(r.seq for r in plan.records if r.thread_id == run.main_thread_id)
            final = plan.run_statuses.get(run.run_id, "active")
            if run.run_id in t.runs:
                raise race_conflict("?", "runs_pkey")
            if final == "active" and any(
                o["session_id"] == run.session_id and o["status"] == "active" for o in t.runs.values()
            ):
                raise race_conflict("?", "runs_one_active")
            t.runs[run.run_id] = {
                "run_id": run.run_id,
                "session_id": run.session_id,
                "status": final,
                "main_thread_id": run.main_thread_id,
                "snapshot_through": session_seq_of(run.main_thread_id, first) - 1,
                "task_budget": None if run.task_budget is None else run.task_budget.model_dump_json(),
                "created": t.tick(),
            }
        for run_id, status in plan.run_statuses.items():
            if run_id not in new and status == "active":
                set_status(run_id, status)
        for session_id, thread_id, seq in plan.resets:
            origin = session_seq_of(thread_id, seq)
            session = t.sessions[session_id]
            session["reset_seq"] = max(session["reset_seq"], origin)
            for tid, view in t.views.items():
                if t.heads.get(tid, {}).get("session_id") == session_id:
                    view.update(
                        view_revision=view["view_revision"] + 1,
                        summary_id=None,
                        covered_to=0,
                        baseline_user_turns=0,
                        baseline_model_steps=0,
                        baseline_watermark=origin,
                        throttle=None,
                        deferred_reason=None,
                        pending_fingerprint=None,
                        pending_since=None,
                    )

    def _write_state(self, plan: BatchPlan) -> None:
        t = self._t
        for session_id, revision in sorted(plan.session_catalogs.items()):
            if (s := t.sessions.get(session_id)) is not None and s["catalog_revision"] is None:
                s["catalog_revision"] = revision
        for (
            session_id,
            operation_id,
            thread_id,
            call_id,
            tool,
            request_sha,
            requested,
        ) in plan.receipts_requested:
            if (session_id, operation_id) in t.receipts or any(
                r["thread_id"] == thread_id and r["call_id"] == call_id for r in t.receipts.values()
            ):
                raise _unique_violation("receipts_pkey")
            t.receipts[(session_id, operation_id)] = {
                "operation_id": operation_id,
                "thread_id": thread_id,
                "call_id": call_id,
                "tool": tool,
                "request_sha256": request_sha,
                "status": "requested",
                "requested_event": requested,
                "finished_event": None,
                "response_sha256": None,
                "external_ref": None,
                "reconciled_event": None,
            }
        for thread_id, call_id, status, finished, response_sha, ref in plan.receipts_finished:
            for r in t.receipts.values():
                if r["thread_id"] == thread_id and r["call_id"] == call_id:
                    r.update(
                        status=status, finished_event=finished, response_sha256=response_sha, external_ref=ref
                    )
        for session_id, operation_id, status, ref, reconciled in plan.receipts_reconciled:
            receipt = t.receipts.get((session_id, operation_id))
            if receipt is not None and receipt["status"] in ("requested", "unknown", "timeout"):
                external_ref = ref if ref is not None else receipt["external_ref"]  # COALESCE, not truthiness
                receipt.update(status=status, external_ref=external_ref, reconciled_event=reconciled)
        for thread_id, seq, event_key, write, ops in plan.state_writes:
            if write.proposal:
                t.proposals.append(
                    {
                        "thread_id": thread_id,
                        "seq": seq,
                        "event_key": event_key,
                        "ops": [o.model_dump(mode="json") for o in ops],
                    }
                )
                continue
            for aggregate, version in sorted(write.versions.items()):
                current = t.versions.get((thread_id, aggregate))
                if current is not None and current != version - 1:
                    raise RevisionConflict(thread_id, version - 1, None)
                t.versions[(thread_id, aggregate)] = version
            for fact in write.facts:
                old = t.facts.get((thread_id, fact.path))
                if old is not None and old.seq != fact.seq:
                    t.retired.add((thread_id, old.seq))
                # Round-tripped like a jsonb column, so a stored value never aliases the caller's.
                t.facts[(thread_id, fact.path)] = copy.deepcopy(fact)

    async def insert_dead_letter(self, rejection: Rejection, *, keep_raw: int) -> None:
        raw = rejection.incoming.data
        digest = sha256_hex(raw)
        if any(
            d["stream_seq"] == rejection.incoming.stream_seq and d["raw_sha256"] == digest
            for d in self._t.dead_letters
        ):
            return
        _, truncated = encode_raw(raw, keep_raw)
        stored = parse_stored_subject(rejection.incoming.subject)
        self._t.dead_letters.append(
            {
                "id": self._t.tick(),
                "thread_id": rejection.thread_id,
                "event_key": rejection.event_key,
                "code": rejection.code.value,
                "reason": rejection.reason,
                "details": json.loads(json.dumps(rejection.details)),
                "subject": rejection.incoming.subject,
                "stream_seq": rejection.incoming.stream_seq,
                "raw_sha256": digest,
                "raw_size": len(raw),
                "raw": raw[:keep_raw],
                "raw_truncated": truncated,
                "tenant": stored.tenant if stored else DEFAULT_TENANT,
                "named_thread_id": rejection.named_thread,
            }
        )

    # Views.

    def _record(self, row: _Row) -> LedgerRecord:
        # The row → LedgerRecord mapping is the store's one (``_ledger_record``): fed the same columns.
        return _ledger_record(cast(Any, {**row, "text": self._view_text(row)}))

    def _view_text(self, row: _Row) -> str | None:
        """``COALESCE(view_text, text, blob)``, as the records queries read it."""
        if row["view_text"] is not None:
            return str(row["view_text"])
        if row["text"] is not None:
            return str(row["text"])
        blob = self._t.blobs.get(row["blob_sha256"]) if row["blob_sha256"] else None
        return None if blob is None else blob.decode("utf-8", "replace")

    async def select_head(self, thread_id: str) -> StoredHead | None:
        h = self._t.heads.get(thread_id)
        return None if h is None else head_of_row(h)

    async def thread_at_head(
        self,
        thread_id: str,
        *,
        facts_of_revision: int | None = None,
        records_after: int | None = None,
        event_key: str | None = None,
    ) -> ThreadAtHead | None:
        head = await self.select_head(thread_id)
        if head is None:
            return None
        fresh = head.revision != facts_of_revision
        scope = await self.scope_of(thread_id)
        return ThreadAtHead(
            head,
            scope,
            await self.load_view(thread_id),
            await self.current_window(thread_id),
            (await self.read_states([thread_id])).get(thread_id) if fresh else None,
            fresh,
            None
            if records_after is None
            else await self.select_records(thread_id, gt=records_after, lte=head.last_seq),
            None if event_key is None else await self.find_event_outcome(scope.tenant, thread_id, event_key),
        )

    async def scope_of(self, thread_id: str) -> ThreadScope:
        h = self._t.heads.get(thread_id)
        if h is None or (s := self._t.sessions.get(h["session_id"])) is None:
            return ThreadScope()
        run = self._t.runs.get(h["run_id"]) or {"snapshot_through": 0, "status": None, "task_budget": None}
        # The columns SCOPE_COLUMNS reads: the head's role and parent, the session's, the run's.
        return scope_of_row({**s, **h, **run, "run_status": run["status"]})

    async def select_records(self, thread_id: str, *, gt: int, lte: int) -> list[LedgerRecord]:
        return [self._record(r) for r in self._thread_rows(thread_id) if gt < r["seq"] <= lte]

    async def select_inherited(
        self, session_id: str, *, after: int, through: int, exclude_thread: str
    ) -> list[LedgerRecord]:
        rows = self._main_rows(session_id, after, through)
        return [self._record(r) for r in rows if r["thread_id"] != exclude_thread]

    def _main_rows(self, session_id: str, after: int, through: int) -> list[_Row]:
        """The session's main-thread records with ``after < session_seq <= through``, in order."""
        return sorted(
            (
                r
                for r in self._t.records.values()
                if r["session_id"] == session_id
                and after < r["session_seq"] <= through
                and self._t.heads.get(r["thread_id"], {}).get("role") == "main"
            ),
            key=lambda r: r["session_seq"],
        )

    async def select_refs(self, refs: Sequence[tuple[str, int]]) -> list[LedgerRecord]:
        rows = sorted(
            (r for ref in refs if (r := self._t.records.get(ref)) is not None), key=lambda r: r["session_seq"]
        )
        return [self._record(r) for r in rows]

    # Branches (forks and exports), as services/store/branches.py.

    async def select_fork(self, session_id: str) -> ForkOrigin | None:
        return self._t.forks.get(session_id)

    async def select_fork_parent(self, tenant: str, session_id: str) -> ForkParent | None:
        s = self._t.sessions.get(session_id)
        if s is None or s["tenant"] != tenant:
            return None
        return ForkParent(session_id, s["last_seq"], s["principal_id"])

    async def insert_fork(self, fork: NewFork) -> bool:
        parent = self._t.sessions.get(fork.parent_session_id)
        if parent is None or fork.session_id in self._t.sessions:
            return False
        self._t.sessions[fork.session_id] = {
            **parent,
            "session_id": fork.session_id,
            "last_seq": fork.at_seq,
            "reset_seq": fork.inherited_reset,
        }
        self._t.forks[fork.session_id] = ForkOrigin(fork.parent_session_id, fork.at_seq, fork.inherited_reset)
        return True

    async def last_reset(self, session_id: str, through: int) -> int:
        return max(
            (
                r["session_seq"]
                for r in self._t.records.values()
                if r["session_id"] == session_id
                and r["kind"] == "context_reset"
                and r["session_seq"] <= through
            ),
            default=0,
        )

    async def select_history(
        self, session_id: str, *, after: int, through: int, limit: int
    ) -> list[HistoryRow]:
        blobs = self._t.blobs
        return [
            history_of_row(
                {**r, "text": blobs[r["blob_sha256"]].decode() if r["text"] is None else r["text"]}
            )
            for r in self._main_rows(session_id, after, through)[:limit]
        ]

    async def summary_chain(self, summary_id: str) -> list[tuple[int, SummaryRow]]:
        chain: list[tuple[int, SummaryRow]] = []
        parent = self._t.summaries[summary_id]["parent_summary_id"]
        while parent is not None:
            s = self._t.summaries[parent]
            chain.append((s["view_revision"], summary_of_row(s)))
            parent = s["parent_summary_id"]
        return chain

    async def load_view(self, thread_id: str) -> ViewState:
        v = self._t.views.get(thread_id)
        if v is None:
            return ViewState()
        summary = None if v["summary_id"] is None else summary_of_row(self._t.summaries[v["summary_id"]])
        since = v["pending_since"]
        return view_of_row({**v, "pending_age_s": None if since is None else self._now() - since}, summary)

    async def candidates(self, session_id: str, thread_id: str, through: int) -> list[Candidate]:
        found = [
            Candidate(tid, v["summary_id"], v["covered_to"], v["baseline_watermark"])
            for tid, v in self._t.views.items()
            if v["summary_id"] is not None
            and tid != thread_id
            and v["covered_to"] <= through
            and (h := self._t.heads.get(tid)) is not None
            and h["session_id"] == session_id
            and h["role"] == "main"
        ]
        return sorted(found, key=lambda c: (-c.covered_to, c.thread_id))[:8]

    async def adopt(self, thread_id: str, expected_revision: int, candidate: Candidate) -> bool:
        view = self._t.views.get(thread_id)
        if view is None:
            # As the upsert's insert path:
            # a thread that never had a view gets revision 1 whatever was expected.
            view = self._t.views[thread_id] = _new_view(thread_id)
        elif view["view_revision"] != expected_revision or view["summary_id"] is not None:
            return False
        view.update(
            view_revision=view["view_revision"] + 1,
            summary_id=candidate.summary_id,
            covered_to=candidate.covered_to,
            baseline_watermark=candidate.baseline_watermark,
        )
        return True

    async def session_policy(self, session_id: str) -> tuple[str, str, int] | None:
        s = self._t.sessions.get(session_id)
        return None if s is None else (s["tenant"], s["policy_name"], s["policy_revision"])

    async def get_policy(
        self, tenant: str, name: str, revision: int | None = None
    ) -> tuple[int, ContextPolicy] | None:
        found = sorted(
            (r, p)
            for (tn, n, r), p in self._t.policies.items()
            if tn in (tenant, "") and n == name and revision in (None, r)
        )
        return None if not found else (found[-1][0], found[-1][1].model_copy(deep=True))

    async def read_states(self, thread_ids: Sequence[str]) -> dict[str, StateView]:
        views: dict[str, StateView] = {}
        for (tid, path), fact in self._t.facts.items():
            if tid in thread_ids:
                views.setdefault(tid, StateView()).facts[path] = copy.deepcopy(fact)
        for (tid, aggregate), version in self._t.versions.items():
            if tid in thread_ids:
                views.setdefault(tid, StateView()).versions[aggregate] = version
        return views

    async def read_session_catalog(self, session_id: str) -> ToolCatalog | None:
        s = self._t.sessions.get(session_id)
        if s is None:
            return None
        return self._t.catalogs.get((s["tenant"], s["agent_release"], s["catalog_revision"]))

    def _view(self, thread_id: str) -> Iterator[_Row]:
        view = self._t.views.get(thread_id)
        if view is not None:
            yield view

    async def ensure_view(self, thread_id: str) -> None:
        if thread_id not in self._t.heads:
            raise StoreRejected(
                "ForeignKeyViolationError",
                "23503",
                'insert or update on table "thread_views" violates foreign key',
            )
        self._t.views.setdefault(thread_id, _new_view(thread_id))

    async def note_prepare_budget(self, thread_id: str, budget: int, reserved: int) -> None:
        for view in self._view(thread_id):
            view.update(prepare_budget=budget, prepare_reserved=reserved)

    async def set_pending(self, thread_id: str, fingerprint: str, *, stale_after_s: float) -> bool:
        for view in self._view(thread_id):
            since = view["pending_since"]
            if view["pending_fingerprint"] is None or (
                since is not None and since < self._now() - stale_after_s
            ):
                view.update(pending_fingerprint=fingerprint, pending_since=self._now())
                return True
        return False

    async def clear_pending(self, thread_id: str, fingerprint: str) -> None:
        for view in self._view(thread_id):
            if view["pending_fingerprint"] == fingerprint:
                view.update(pending_fingerprint=None, pending_since=None)

    async def mark_evaluated(self, thread_id: str, head_revision: int) -> None:
        for view in self._view(thread_id):
            view["evaluated_revision"] = max(view["evaluated_revision"], head_revision)

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
        for view in self._view(thread_id):
            view.update(
                throttle=None if throttle is None else json.dumps(throttle.to_json()),
                deferred_reason=reason,
                attempts=view["attempts"] + int(counts_as_attempt),
                failures=view["failures"] + int(failed),
                last_failure=reason if failed and reason is not None else view["last_failure"],
            )
            if view["pending_fingerprint"] == (fingerprint or ""):
                view.update(pending_fingerprint=None, pending_since=None)

    async def current_window(self, thread_id: str) -> OpenWindow | None:
        rows = [w for (t, _), w in self._t.windows.items() if t == thread_id]
        if not rows:
            return None
        row = max(rows, key=lambda w: int(w["window_no"]))
        body = self._t.handoffs[str(row["handoff_id"])]["body"]
        return OpenWindow(row["window_no"], row["opened_after"], WindowHandoff.model_validate_json(body))

    async def windows_closed_after(self, thread_id: str) -> list[int]:
        rows = sorted((n, w["opened_after"]) for (t, n), w in self._t.windows.items() if t == thread_id)
        return [after for _, after in rows]

    async def commit_window(self, expected_view_revision: int, handoff: WindowHandoff, tokens: int) -> int:
        await self.ensure_view(handoff.thread_id)
        view = self._t.views[handoff.thread_id]
        if view["view_revision"] != expected_view_revision:
            raise RevisionConflict(handoff.thread_id, expected_view_revision, view["view_revision"])
        if (
            handoff.thread_id,
            handoff.new_window,
        ) in self._t.windows or handoff.handoff_id in self._t.handoffs:
            raise _unique_violation("windows_pkey")
        async with self.transaction():
            revision = expected_view_revision + 1
            self._t.views[handoff.thread_id].update(view_revision=revision)
            self._t.handoffs[handoff.handoff_id] = {
                "thread_id": handoff.thread_id,
                "new_window": handoff.new_window,
                "body": handoff.model_dump_json(),
                "tokens": tokens,
            }
            kill_point("rollover.before_commit")
            self._t.windows[(handoff.thread_id, handoff.new_window)] = {
                "window_no": handoff.new_window,
                "opened_after": handoff.last_event_seq,
                "handoff_id": handoff.handoff_id,
            }
        kill_point("rollover.after_commit")
        return revision

    async def commit_summary(self, expected_revision: int, summary: NewSummary) -> str:
        await self.ensure_view(summary.thread_id)
        view = self._t.views.get(summary.thread_id)
        if view is None or view["view_revision"] != expected_revision:
            raise RevisionConflict(
                summary.thread_id, expected_revision, None if view is None else view["view_revision"]
            )
        new_revision = expected_revision + 1
        summary_id = summary_id_of(
            summary.thread_id, new_revision, summary.body.covered_from, summary.covered_to
        )
        if summary_id in self._t.summaries or any(
            s["thread_id"] == summary.thread_id and s["view_revision"] == new_revision
            for s in self._t.summaries.values()
        ):
            raise _unique_violation("summaries_revision")
        async with self.transaction():
            self._t.summaries[summary_id] = {
                "summary_id": summary_id,
                "thread_id": summary.thread_id,
                "view_revision": new_revision,
                "parent_summary_id": summary.parent_summary_id,
                "covered_from": summary.body.covered_from,
                "covered_to": summary.covered_to,
                "body": summary.body.model_dump_json(),
                "text": summary.text,
                "tokens_o200k": summary.tokens_o200k,
                "tokens_cl100k": summary.tokens_cl100k,
                "job_id": summary.job_id,
                "summarizer": summary.summarizer,
                "trigger_reasons": tuple(summary.trigger_reasons),
                "tokens_before": summary.tokens_before,
                "tokens_after": summary.tokens_after,
                "target_reached": summary.target_reached,
                # Stored as the column is, so both stores parse the same text.
                "hooks": summary_hooks_json(summary.hooks),
            }
            # Looked up again: the transaction may have replaced the tables object.
            self._t.views[summary.thread_id].update(
                view_revision=new_revision,
                summary_id=summary_id,
                covered_to=summary.covered_to,
                baseline_user_turns=summary.baseline.user_turns,
                baseline_model_steps=summary.baseline.model_steps,
                baseline_watermark=summary.source_watermark,
                throttle=None if summary.throttle is None else json.dumps(summary.throttle.to_json()),
                deferred_reason=None,
                attempts=view["attempts"] + 1,
                pending_fingerprint=None,
                pending_since=None,
            )
            kill_point("compact.before_commit")
        kill_point("compact.after_commit")
        return summary_id

    # Prepares and inspections.

    async def find_event_outcome(self, tenant: str, thread_id: str, event_key: str) -> EventOutcome:
        for r in self._t.records.values():
            if r["thread_id"] == thread_id and r["event_key"] == event_key:
                session = self._t.sessions.get(r["session_id"])
                if session is not None and session["tenant"] == tenant:
                    return EventOutcome(int(r["seq"]), r["content_sha256"], None)
        for d in reversed(self._t.dead_letters):
            if (
                thread_id in (d["thread_id"], d["named_thread_id"])
                and d["event_key"] == event_key
                and d["tenant"] == tenant
            ):
                return EventOutcome(None, None, (d["code"], d["reason"]))
        return EventOutcome(None, None, None)

    async def select_evidence(
        self, session_id: str, refs: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], EvidenceRow]:
        out: dict[tuple[str, int], EvidenceRow] = {}
        for ref in refs:
            r = self._t.records.get(ref)
            if r is not None and r["session_id"] == session_id:
                blob = self._t.blobs.get(r["blob_sha256"]) if r["text"] is None and r["blob_sha256"] else None
                out[ref] = evidence_of_row({**r, "blob": blob})
        return out

    def _thread_rows(self, thread_id: str) -> list[_Row]:
        return sorted(
            (r for (tid, _), r in self._t.records.items() if tid == thread_id), key=lambda r: r["seq"]
        )

    async def totals(self, thread_id: str) -> tuple[int, int]:
        rows = self._thread_rows(thread_id)
        return len(rows), sum(r["tokens_o200k"] for r in rows)

    async def select_links(self, thread_id: str) -> list[ChainLink]:
        return [
            ChainLink(r["seq"], r["content_sha256"], r["prev_hash"], r["record_hash"])
            for r in self._thread_rows(thread_id)
        ]

    async def select_tail(self, thread_id: str, *, limit: int, preview_chars: int) -> list[InspectedRecord]:
        return [
            InspectedRecord(
                seq=r["seq"],
                session_seq=r["session_seq"],
                kind=r["kind"],
                event_key=r["event_key"],
                tokens=r["tokens_o200k"],
                content_sha256=r["content_sha256"],
                record_hash=r["record_hash"],
                blob_sha256=r["blob_sha256"],
                preview=_preview(r)[:preview_chars] or self._blob_preview(r, preview_chars),
                tools=self._tools(thread_id, r),
                status=json.loads(r["payload"]).get("status") if r["kind"] == "tool_outcome" else None,
            )
            for r in reversed(self._thread_rows(thread_id)[-limit:] if limit > 0 else [])
        ]

    def _blob_preview(self, row: _Row, chars: int) -> str:
        if row["text"] is not None or row["view_text"] is not None or not row["blob_sha256"]:
            return ""
        return blob_preview(self._t.blobs[row["blob_sha256"]][: chars * 4], chars)

    def _tools(self, thread_id: str, row: _Row) -> tuple[str, ...]:
        """As the PostgreSQL store's tail: the calls' names, or the tool an outcome answers."""
        payload = json.loads(row["payload"])
        if row["kind"] == "tool_outcome":
            call = self._t.calls.get((thread_id, str(payload.get("call_id"))))
            return (call["name"],) if call else ()
        return tuple(_call_names(payload))

    async def select_full(self, thread_id: str) -> list[FullRecord]:
        out: list[FullRecord] = []
        for r in self._thread_rows(thread_id):
            text = r["text"] if r["text"] is not None else self._t.blobs[r["blob_sha256"]].decode("utf-8")
            ts = r["client_ts"].isoformat() if r["client_ts"] else None
            out.append((r["seq"], r["event_key"], r["kind"], json.loads(r["payload"]), text or "", ts))
        return out

    async def open_call_ids(self, thread_id: str) -> list[str]:
        open_calls = [
            (c["call_seq"], cid)
            for (tid, cid), c in self._t.calls.items()
            if tid == thread_id and c["outcome_seq"] is None
        ]
        return [cid for _, cid in sorted(open_calls)]

    async def count_dead_letters(self, thread_id: str) -> int:
        return sum(1 for d in self._t.dead_letters if d["thread_id"] == thread_id)

    async def recent_dead_letters(self, thread_id: str, limit: int) -> list[InspectedDeadLetter]:
        mine = [d for d in self._t.dead_letters if d["thread_id"] == thread_id]
        return [
            InspectedDeadLetter(
                stream_seq=d["stream_seq"], event_key=d["event_key"], code=d["code"], reason=d["reason"]
            )
            for d in sorted(mine, key=lambda d: d["id"], reverse=True)[:limit]
        ]

    async def summary_count(self, thread_id: str) -> int:
        return sum(1 for s in self._t.summaries.values() if s["thread_id"] == thread_id)

    async def read_calibration(self, tenant: str, profile: str) -> Calibration:
        return self._t.calibrations.get((tenant, profile), Calibration())

    async def update_calibration(
        self, tenant: str, profile: str, rule: Callable[[Calibration], Calibration]
    ) -> Calibration:
        new = rule(self._t.calibrations.get((tenant, profile), Calibration()))
        if new.factor < 1.0:
            raise StoreRejected("CheckViolationError", "23514", "calibrations_factor_check")
        self._t.calibrations[(tenant, profile)] = new
        return new

    async def note_overflow(self, thread_id: str, profile: str, overflow: ProviderOverflow) -> bool:
        return self._t.overflows.setdefault((thread_id, overflow.view_revision), overflow) is overflow


if TYPE_CHECKING:
    # Checked by mypy: the memory store implements every port it claims to.
    def _implements(
        store: MemoryStore,
    ) -> tuple[RecordingStore, PrepareStore, ViewStore, BranchStore, ListingStore]:
        return store, store, store, store, store


def _preview(row: dict[str, Any]) -> str:
    """As the PostgreSQL store's tail: the text, else the names of the calls of a calls-only message."""
    text = row["view_text"] if row["view_text"] is not None else row["text"] or ""
    if text:
        return text
    names = _call_names(json.loads(row["payload"]))
    return "calls: " + ", ".join(names) if names else ""


def _call_names(payload: dict[str, Any]) -> list[str]:
    calls = payload.get("tool_calls")
    return [c.get("name", "") for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
