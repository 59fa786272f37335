"""One batch of events in, one transaction of ledger writes out: what the recorder reads before planning
(heads, keys, calls, sessions, runs, state, catalogs, receipts) and how it applies the plan."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import JsonValue


from contracts import ToolCatalog

from contracts.exceptions import RevisionConflict
from services.core.ledger import (
    BatchKeys,
    BatchPlan,
    CallState,
    KnownKey,
    LedgerReads,
    ThreadHead,
)
from services.core.runs import RunState, ThreadMeta
from services.core.state import Fact, StateView, aggregate_of

from services.store.batch_write import (
    FINISHED_RECEIPT,
    LedgerWritten,
    Position,
    one_statement,
    settles_receipts,
    unnest_args,
    write_ledger,
)
from services.store.ledger import Conn
from services.store.tracking import insert_dead_letter

__all__ = [
    "FACTS_JSON",
    "VERSIONS_JSON",
    "read_for_batch",
    "read_session_catalog",
    "read_states",
    "states_from_json",
    "write_plan",
]


_INSERT_RUN = """
INSERT INTO ctx.runs (run_id, session_id, status, main_thread_id, snapshot_through, task_budget)
VALUES ($1, $2, $5, $3, $4, $6::jsonb)
"""


_UPDATE_RUN = "UPDATE ctx.runs SET status = $2, updated_at = now() WHERE run_id = $1"


_SET_PRINCIPALS = """
UPDATE ctx.sessions s SET principal_id = u.value
FROM unnest($1::text[], $2::text[]) AS u(session_id, value)
WHERE s.session_id = u.session_id AND s.principal_id IS NULL
"""


_SET_RELEASES = """
UPDATE ctx.sessions s SET agent_release = u.value
FROM unnest($1::text[], $2::text[]) AS u(session_id, value)
WHERE s.session_id = u.session_id AND s.agent_release IS NULL
"""


_RESET_SESSION = "UPDATE ctx.sessions SET reset_seq = GREATEST(reset_seq, $2) WHERE session_id = $1"


_RESET_VIEWS = """
UPDATE ctx.thread_views v
SET view_revision = v.view_revision + 1, summary_id = NULL, covered_to = 0, baseline_user_turns = 0,
    baseline_model_steps = 0, baseline_watermark = $2, throttle = NULL, deferred_reason = NULL,
    pending_fingerprint = NULL, pending_since = NULL, updated_at = now()
FROM ctx.thread_heads h WHERE h.thread_id = v.thread_id AND h.session_id = $1
"""


_SET_THREAD_ROLES = """
UPDATE ctx.thread_heads h SET role = u.role, parent_thread_id = u.parent
FROM unnest($1::text[], $2::text[], $3::text[]) AS u(thread_id, role, parent)
WHERE h.thread_id = u.thread_id
"""


_INSERT_BLOBS = """
INSERT INTO ctx.blobs (sha256, content, size)
SELECT * FROM unnest($1::text[], $2::bytea[], $3::bigint[])
ON CONFLICT (sha256) DO NOTHING
"""


_SELECT_FACTS = """
SELECT thread_id, path, value, status, source, event_key, seq, observed_at,
       supersedes, superseded_value, evidence
FROM ctx.state_facts WHERE thread_id = ANY($1::text[]) AND is_current
"""


_SELECT_VERSIONS = (
    "SELECT thread_id, aggregate, version FROM ctx.state_versions WHERE thread_id = ANY($1::text[])"
)


_SESSION_CATALOGS = """
SELECT s.session_id, c.revision, c.body FROM ctx.sessions s
JOIN ctx.tool_catalogs c ON c.tenant = s.tenant AND c.release = s.agent_release
  AND c.revision = s.catalog_revision
WHERE s.session_id = ANY($1::text[])
"""


_RETIRE_FACT = """
UPDATE ctx.state_facts SET is_current = false, valid_to_seq = $3
WHERE thread_id = $1 AND path = $2 AND is_current
"""


_INSERT_FACT = """
INSERT INTO ctx.state_facts (thread_id, path, aggregate, seq, value, status, source, event_key, observed_at,
                             supersedes, superseded_value, is_current, evidence)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11::jsonb, true, $12::text[])
"""


_BUMP_VERSION = """
INSERT INTO ctx.state_versions (thread_id, aggregate, version) VALUES ($1, $2, $3)
ON CONFLICT (thread_id, aggregate) DO UPDATE SET version = EXCLUDED.version
WHERE ctx.state_versions.version = EXCLUDED.version - 1
RETURNING version
"""


_INSERT_PROPOSAL = (
    "INSERT INTO ctx.state_proposals (thread_id, seq, event_key, ops) VALUES ($1, $2, $3, $4::jsonb)"
)


_SET_CATALOG = (
    "UPDATE ctx.sessions SET catalog_revision = $2 WHERE session_id = $1 AND catalog_revision IS NULL"
)


_INSERT_RECEIPTS = """
INSERT INTO ctx.receipts (session_id, operation_id, thread_id, call_id, tool, request_sha256,
                          status, requested_event)
SELECT u.session_id, u.operation_id, u.thread_id, u.call_id, u.tool, u.request_sha256, 'requested', u.event
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
    AS u(session_id, operation_id, thread_id, call_id, tool, request_sha256, event)
"""


_RECONCILE_RECEIPT = """
UPDATE ctx.receipts SET status = $3, external_ref = COALESCE($4, external_ref), reconciled_event = $5
WHERE session_id = $1 AND operation_id = $2 AND status IN ('requested', 'unknown', 'timeout')
"""


# Every outcome of the batch in one statement, for a batch that also requests receipts (any other
# settles them in its ledger statement: batch_write.py); a call has at most one outcome (a second one
# is dead-lettered), so no receipt row is matched twice.
_FINISH_RECEIPTS = """
UPDATE ctx.receipts r
SET status = u.status, finished_event = u.finished_event, response_sha256 = u.response_sha256,
    external_ref = u.external_ref
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
    AS u(thread_id, call_id, status, finished_event, response_sha256, external_ref)
WHERE r.thread_id = u.thread_id AND r.call_id = u.call_id
"""


# The JSON rows of a thread's current facts and aggregate versions, as states_from_json reads them.
FACTS_JSON = """json_build_array(
       thread_id, path, value::text, status, source, event_key, seq, observed_at,
       supersedes, superseded_value::text, evidence)"""
VERSIONS_JSON = "json_build_array(thread_id, aggregate, version)"


# Every read a batch needs in one round trip: ``ctx.batch_reads``, one statement whose
# sub-selects each aggregate one of the reads to a JSON array (json and jsonb columns as text, parsed
# exactly as the row-per-query reads parsed them), planned once per connection.
_READ_BATCH = f"SELECT * FROM ctx.batch_reads({', '.join(f'${n}' for n in range(1, 16))})"


def _json_or_none(text: str | None) -> JsonValue:
    return json.loads(text) if text is not None else None


async def read_for_batch(
    conn: Conn, wanted: BatchKeys, tracking: tuple[str, int] | None = None
) -> LedgerReads:
    """Everything :func:`services.core.ledger.plan_batch` needs to know of the ledger, in one round trip;
    with ``tracking`` (consumer, partition), that consumer's position too."""
    row = await conn.fetchrow(
        _READ_BATCH,
        list({*wanted.thread_ids, *wanted.extra_threads}),
        [k[0] for k in wanted.keys],
        [k[1] for k in wanted.keys],
        [c[0] for c in wanted.calls],
        [c[1] for c in wanted.calls],
        list(wanted.session_ids),
        list(wanted.tenants),
        list(wanted.run_ids),
        list(wanted.thread_ids),
        [o[0] for o in wanted.operation_ids],
        [o[1] for o in wanted.operation_ids],
        [k[0] for k in wanted.release_names],
        [k[1] for k in wanted.release_names],
        tracking[0] if tracking is not None else None,
        tracking[1] if tracking is not None else None,
    )
    assert row is not None  # an aggregate-only SELECT always returns its one row
    asked = set(wanted.thread_ids)
    heads: dict[str, ThreadHead] = {}
    metas: dict[str, ThreadMeta] = {}
    for thread_id, session_id, revision, last_seq, last_hash, last_key, role, parent in json.loads(
        row["heads"]
    ):
        metas[thread_id] = ThreadMeta(thread_id, session_id, role, parent, last_seq)
        if thread_id in asked:
            heads[thread_id] = ThreadHead(thread_id, session_id, revision, last_seq, last_hash, last_key)
    known = {(t, k): KnownKey(seq, sha) for t, k, seq, sha in json.loads(row["keys"])}
    states = {
        (t, call_id): CallState(call_id, call_seq, outcome_seq, name, json.loads(args) if args else {})
        for t, call_id, call_seq, outcome_seq, name, args in json.loads(row["calls"])
    }
    session_rows = json.loads(row["sessions"])
    runs: dict[str, RunState] = {}
    active: dict[str, str] = {}
    for run_id, session_id, status, main_thread_id in json.loads(row["runs"]):
        runs[run_id] = RunState(run_id, session_id, status, main_thread_id)
        if status == "active":
            active[session_id] = run_id
    views = states_from_json(row["facts"], row["versions"])
    return LedgerReads(
        heads=heads,
        keys=known,
        calls=states,
        sessions={s: tenant for s, tenant, _, _ in session_rows},
        policies=frozenset((tenant, name) for tenant, name in json.loads(row["policies"])),
        runs=runs,
        active_runs=active,
        threads=metas,
        principals={s: principal for s, _, principal, _ in session_rows},
        releases={s: release for s, _, _, release in session_rows},
        states=views,
        catalogs={
            s: (revision, ToolCatalog.model_validate_json(body))
            for s, revision, body in json.loads(row["catalogs"])
        },
        latest_catalogs={
            (tenant, release): (revision, ToolCatalog.model_validate_json(body))
            for tenant, release, revision, body in json.loads(row["latest"])
        },
        operations=frozenset((s, o) for s, o in json.loads(row["operations"])),
        tracked=int(row["tracked"] or 0),
    )


def states_from_json(facts: str | None, versions: str | None) -> dict[str, StateView]:
    """Threads' states from ``json_agg`` of ``FACTS_JSON`` and of ``VERSIONS_JSON`` rows (``NULL``: none)."""
    return _states(json.loads(facts or "[]"), json.loads(versions or "[]"))


def _states(facts: Iterable[Any], versions: Iterable[Any]) -> dict[str, StateView]:
    """Threads' states from rows in ``FACTS_JSON``'s and ``VERSIONS_JSON``'s column order."""
    views: dict[str, StateView] = {}
    for thread_id, path, value, status, source, key, seq, observed, supersedes, old, evidence in facts:
        views.setdefault(thread_id, StateView()).facts[path] = Fact(
            path,
            _json_or_none(value),
            status,
            source,
            key,
            seq,
            observed,
            supersedes,
            _json_or_none(old),
            tuple(evidence or ()),
        )
    for thread_id, aggregate, version in versions:
        views.setdefault(thread_id, StateView()).versions[aggregate] = version
    return views


async def read_session_catalog(conn: Conn, session_id: str) -> ToolCatalog | None:
    """The catalog revision a session pinned, if its release has one."""
    row = await conn.fetchrow(_SESSION_CATALOGS, [session_id])
    return None if row is None else ToolCatalog.model_validate_json(row["body"])


async def read_states(conn: Conn, thread_ids: Sequence[str]) -> dict[str, StateView]:
    """Current facts and aggregate versions of threads."""
    ids = list(thread_ids)
    return _states(await conn.fetch(_SELECT_FACTS, ids), await conn.fetch(_SELECT_VERSIONS, ids))


async def write_plan(
    conn: Conn,
    plan: BatchPlan,
    *,
    recorded_by: str,
    keep_raw: int,
    position: Position | None = None,
    before_commit: Callable[[], None] | None = None,
) -> LedgerWritten:
    """Apply a batch plan, all of it or none, and move ``position`` with it; raises RevisionConflict on
    a moved head. Outside a caller's transaction its blobs are committed first, on their own: content
    under its own hash, which a failed batch leaves behind unreferenced and a retry finds there.

    A plan whose writes are one statement (``one_statement``: a known thread's messages, calls and
    outcomes) commits by itself, without BEGIN and COMMIT round trips; any other runs in a transaction
    (a savepoint inside the caller's). ``before_commit`` runs once the writes are in and not yet
    committed — for one statement, just before it is sent: nothing of it is durable before its own
    commit either.
    """
    if one_statement(plan):
        if before_commit is not None:
            before_commit()
        return await write_ledger(conn, plan, recorded_by, position)
    blobs_first = bool(plan.blobs) and not conn.is_in_transaction()
    if blobs_first:
        # Committed on their own, before the transaction whose records point at them (a foreign key).
        # A blob is its content's hash and never changes, so one left without a record (the batch
        # then failed) is harmless; inserted inside the transaction, its row stayed locked until the
        # commit, and every other batch storing the same content (the same file read in many
        # sessions) waited for it, holding its own connection meanwhile.
        await _insert_blobs(conn, plan)
    async with conn.transaction():
        if plan.blobs and not blobs_first:
            await _insert_blobs(conn, plan)
        written = await _write_all(conn, plan, recorded_by=recorded_by, keep_raw=keep_raw, position=position)
        if before_commit is not None:
            before_commit()
    return written


async def _insert_blobs(conn: Conn, plan: BatchPlan) -> None:
    await conn.execute(
        _INSERT_BLOBS,
        [b.sha256 for b in plan.blobs],
        [b.content for b in plan.blobs],
        [len(b.content) for b in plan.blobs],
    )


async def _write_all(
    conn: Conn, plan: BatchPlan, *, recorded_by: str, keep_raw: int, position: Position | None
) -> LedgerWritten:
    written = await write_ledger(conn, plan, recorded_by, position)
    bases = written.bases
    if plan.principals:
        await conn.execute(_SET_PRINCIPALS, *_columns(sorted(plan.principals.items())))
    if plan.releases:
        await conn.execute(_SET_RELEASES, *_columns(sorted(plan.releases.items())))
    if plan.new_threads:
        await conn.execute(
            _SET_THREAD_ROLES,
            list(plan.new_threads),
            [m.role for m in plan.new_threads.values()],
            [m.parent_thread_id for m in plan.new_threads.values()],
        )
    await _write_runs(conn, plan, bases)
    for rejection in plan.rejections:
        await insert_dead_letter(conn, rejection, keep_raw=keep_raw)
    await _write_state(conn, plan)
    return written


async def _write_state(conn: Conn, plan: BatchPlan) -> None:
    """Facts, versions and proposals of the batch's state writes, in the records' transaction."""
    for session_id, revision in sorted(plan.session_catalogs.items()):
        await conn.execute(_SET_CATALOG, session_id, revision)
    if plan.receipts_requested:
        receipt = ("session_id", "operation_id", "thread_id", "call_id", "tool", "request_sha256")
        await conn.execute(
            _INSERT_RECEIPTS, *unnest_args(plan.receipts_requested, *receipt, "requested_event")
        )
    if plan.receipts_finished and not settles_receipts(plan):  # else the ledger statement did
        await conn.execute(_FINISH_RECEIPTS, *unnest_args(plan.receipts_finished, *FINISHED_RECEIPT))
    for c in plan.receipts_reconciled:
        await conn.execute(
            _RECONCILE_RECEIPT, c.session_id, c.operation_id, c.status, c.external_ref, c.reconciled_event
        )
    for w in plan.state_writes:
        thread_id, write = w.thread_id, w.write
        if write.proposal:
            ops = json.dumps([o.model_dump(mode="json") for o in w.ops])
            await conn.execute(_INSERT_PROPOSAL, thread_id, w.seq, w.event_key, ops)
            continue
        for aggregate, version in sorted(write.versions.items()):
            if await conn.fetchval(_BUMP_VERSION, thread_id, aggregate, version) is None:
                raise RevisionConflict(thread_id, version - 1, None)
        for fact in write.facts:
            await conn.execute(_RETIRE_FACT, thread_id, fact.path, fact.seq)
            await conn.execute(
                _INSERT_FACT,
                thread_id,
                fact.path,
                aggregate_of(fact.path),
                fact.seq,
                json.dumps(fact.value),
                fact.status,
                fact.source,
                fact.event_key,
                fact.observed_at,
                fact.supersedes,
                json.dumps(fact.superseded_value),
                list(fact.evidence),
            )


def _session_seq_of(plan: BatchPlan, bases: Mapping[str, int], thread_id: str, seq: int) -> int:
    record = next(r for r in plan.records if r.thread_id == thread_id and r.seq == seq)
    return bases[record.session_id] + record.session_ordinal


async def _write_runs(conn: Conn, plan: BatchPlan, bases: Mapping[str, int]) -> None:
    """New runs with their snapshot boundary, status changes, and context resets."""
    new = {run.run_id for run in plan.new_runs}
    # Final statuses only, ordered so the one-active-run index never sees two active runs at once:
    # runs leaving 'active' first, then new runs, then resumed runs.
    for run_id, status in plan.run_statuses.items():
        if run_id not in new and status != "active":
            await conn.execute(_UPDATE_RUN, run_id, status)
    # New runs are inserted with their final status, ended ones before the one left active.
    for run in sorted(plan.new_runs, key=lambda r: plan.run_statuses.get(r.run_id, "active") == "active"):
        # The snapshot is everything the session committed before the run's first record.
        first = min(r.seq for r in plan.records if r.thread_id == run.main_thread_id)
        through = _session_seq_of(plan, bases, run.main_thread_id, first) - 1
        final = plan.run_statuses.get(run.run_id, "active")
        budget = None if run.task_budget is None else run.task_budget.model_dump_json()
        await conn.execute(
            _INSERT_RUN, run.run_id, run.session_id, run.main_thread_id, through, final, budget
        )
    for run_id, status in plan.run_statuses.items():
        if run_id not in new and status == "active":
            await conn.execute(_UPDATE_RUN, run_id, status)
    for reset in plan.resets:
        origin = _session_seq_of(plan, bases, reset.thread_id, reset.seq)
        await conn.execute(_RESET_SESSION, reset.session_id, origin)
        await conn.execute(_RESET_VIEWS, reset.session_id, origin)


def _columns(pairs: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    return [a for a, _ in pairs], [b for _, b in pairs]
