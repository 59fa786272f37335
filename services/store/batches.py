"""One batch of events in, one transaction of ledger writes out: what the recorder reads before planning
(heads, keys, calls, sessions, runs, state, catalogs, receipts) and how it applies the plan."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence


from contracts import DEFAULT_POLICY_NAME, ToolCatalog
from contracts.subjects import DEFAULT_TENANT

from services.errors import RevisionConflict
from services.core.ledger import (
    BatchPlan,
    CallState,
    HeadWrite,
    KnownKey,
    LedgerReads,
    ThreadHead,
)
from services.core.runs import RunState, ThreadMeta
from services.core.state import Fact, StateView, aggregate_of

from services.store.ledger import Conn
from services.store.tracking import DeadLettersRepo

__all__ = [
    "read_for_batch",
    "read_session_catalog",
    "read_states",
    "write_plan",
]


_SELECT_HEADS = """
SELECT thread_id, session_id, revision, last_seq, last_hash, last_event_key
FROM ctx.thread_heads WHERE thread_id = ANY($1::text[])
"""


_SELECT_KEYS = """
SELECT r.thread_id, r.event_key, r.seq, r.content_sha256
FROM ctx.records r
JOIN unnest($1::text[], $2::text[]) AS k(thread_id, event_key)
  ON r.thread_id = k.thread_id AND r.event_key = k.event_key
"""


_SELECT_CALLS = """
SELECT c.thread_id, c.call_id, c.call_seq, c.outcome_seq, c.name, c.args
FROM ctx.tool_calls c
JOIN unnest($1::text[], $2::text[]) AS k(thread_id, call_id)
  ON c.thread_id = k.thread_id AND c.call_id = k.call_id
"""


_BUMP_SESSION = """
INSERT INTO ctx.sessions (session_id, last_seq, policy_name, policy_revision, tenant)
VALUES ($1, $2, $3, (SELECT max(revision) FROM ctx.policies WHERE name = $3 AND tenant IN ($4, '')), $4)
ON CONFLICT (session_id) DO UPDATE SET last_seq = ctx.sessions.last_seq + EXCLUDED.last_seq
RETURNING last_seq
"""


_SELECT_SESSIONS = (
    "SELECT session_id, tenant, principal_id, agent_release FROM ctx.sessions "
    "WHERE session_id = ANY($1::text[])"
)


_SELECT_RUNS = """
SELECT run_id, session_id, status, main_thread_id FROM ctx.runs
WHERE run_id = ANY($1::text[]) OR (session_id = ANY($2::text[]) AND status = 'active')
"""


_SELECT_THREAD_META = """
SELECT thread_id, session_id, role, parent_thread_id, last_seq FROM ctx.thread_heads
WHERE thread_id = ANY($1::text[])
"""


_INSERT_RUN = """
INSERT INTO ctx.runs (run_id, session_id, status, main_thread_id, snapshot_through)
VALUES ($1, $2, $5, $3, $4)
"""


_UPDATE_RUN = "UPDATE ctx.runs SET status = $2, updated_at = now() WHERE run_id = $1"


_SET_PRINCIPAL = "UPDATE ctx.sessions SET principal_id = $2 WHERE session_id = $1 AND principal_id IS NULL"


_SET_RELEASE = "UPDATE ctx.sessions SET agent_release = $2 WHERE session_id = $1 AND agent_release IS NULL"


_RESET_SESSION = "UPDATE ctx.sessions SET reset_seq = GREATEST(reset_seq, $2) WHERE session_id = $1"


_RESET_VIEWS = """
UPDATE ctx.thread_views v
SET view_revision = v.view_revision + 1, summary_id = NULL, covered_to = 0, baseline_user_turns = 0,
    baseline_model_steps = 0, baseline_watermark = $2, throttle = NULL, deferred_reason = NULL,
    pending_fingerprint = NULL, pending_since = NULL, updated_at = now()
FROM ctx.thread_heads h WHERE h.thread_id = v.thread_id AND h.session_id = $1
"""


_SET_THREAD_ROLE = "UPDATE ctx.thread_heads SET role = $2, parent_thread_id = $3 WHERE thread_id = $1"


_SELECT_POLICY_NAMES = (
    "SELECT DISTINCT tenant, name FROM ctx.policies WHERE tenant = ANY($1::text[]) OR tenant = ''"
)


_INSERT_HEAD = """
INSERT INTO ctx.thread_heads
    (thread_id, session_id, run_id, instance_id, revision, last_seq, last_hash, last_event_key,
     user_turns, model_steps)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (thread_id) DO NOTHING
RETURNING revision
"""


_UPDATE_HEAD = """
UPDATE ctx.thread_heads
SET revision = $2, last_seq = $3, last_hash = $4, last_event_key = $5, updated_at = now(),
    user_turns = user_turns + $7, model_steps = model_steps + $8
WHERE thread_id = $1 AND revision = $6
RETURNING revision
"""


_SELECT_REVISION = "SELECT revision FROM ctx.thread_heads WHERE thread_id = $1"


_INSERT_BLOBS = """
INSERT INTO ctx.blobs (sha256, content, size)
SELECT * FROM unnest($1::text[], $2::bytea[], $3::bigint[])
ON CONFLICT (sha256) DO NOTHING
"""


_INSERT_RECORDS = """
INSERT INTO ctx.records (
    thread_id, seq, session_id, session_seq, run_id, instance_id, event_key, kind, payload, text,
    blob_sha256, view_text, tokens_o200k, tokens_cl100k, content_sha256, prev_hash, record_hash,
    client_ts, stream_seq, recorded_by, mask_text, mask_tokens_o200k, mask_tokens_cl100k)
SELECT * FROM unnest(
    $1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
    $9::json[], $10::text[], $11::text[], $12::text[], $13::integer[], $14::integer[], $15::text[],
    $16::text[], $17::text[], $18::timestamptz[], $19::bigint[], $20::text[], $21::text[],
    $22::integer[], $23::integer[])
"""


_INSERT_CALLS = """
INSERT INTO ctx.tool_calls (thread_id, call_id, name, call_seq, args)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::json[])
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


_LATEST_CATALOGS = """
SELECT DISTINCT ON (c.tenant, c.release) c.tenant, c.release, c.revision, c.body FROM ctx.tool_catalogs c
JOIN unnest($1::text[], $2::text[]) AS k(tenant, release) ON c.tenant = k.tenant AND c.release = k.release
ORDER BY c.tenant, c.release, c.revision DESC
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


_SELECT_OPERATIONS = """
SELECT session_id, operation_id FROM ctx.receipts
JOIN unnest($1::text[], $2::text[]) AS k(s, o) ON session_id = k.s AND operation_id = k.o
"""


_INSERT_RECEIPT = """
INSERT INTO ctx.receipts (session_id, operation_id, thread_id, call_id, tool, request_sha256,
                          status, requested_event)
VALUES ($1, $2, $3, $4, $5, $6, 'requested', $7)
"""


_RECONCILE_RECEIPT = """
UPDATE ctx.receipts SET status = $3, external_ref = COALESCE($4, external_ref), reconciled_event = $5
WHERE session_id = $1 AND operation_id = $2 AND status IN ('requested', 'unknown', 'timeout')
"""


_FINISH_RECEIPT = """
UPDATE ctx.receipts SET status = $3, finished_event = $4, response_sha256 = $5, external_ref = $6
WHERE thread_id = $1 AND call_id = $2
"""


_CLOSE_CALLS = """
UPDATE ctx.tool_calls t SET outcome_seq = u.seq, status = u.status
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS u(thread_id, call_id, seq, status)
WHERE t.thread_id = u.thread_id AND t.call_id = u.call_id AND t.outcome_seq IS NULL
"""


async def read_for_batch(
    conn: Conn,
    thread_ids: Sequence[str],
    keys: Sequence[tuple[str, str]],
    calls: Sequence[tuple[str, str]],
    session_ids: Sequence[str] = (),
    run_ids: Sequence[str] = (),
    extra_threads: Sequence[str] = (),
    release_names: Sequence[tuple[str, str]] = (),
    operation_ids: Sequence[tuple[str, str]] = (),
    tenants: Sequence[str] = (),
) -> LedgerReads:
    """Everything :func:`services.core.ledger.plan_batch` needs to know about the ledger."""
    heads = {
        r["thread_id"]: ThreadHead(
            r["thread_id"], r["session_id"], r["revision"], r["last_seq"], r["last_hash"], r["last_event_key"]
        )
        for r in await conn.fetch(_SELECT_HEADS, list(thread_ids))
    }
    known = (
        {
            (r["thread_id"], r["event_key"]): KnownKey(r["seq"], r["content_sha256"])
            for r in await conn.fetch(_SELECT_KEYS, [k[0] for k in keys], [k[1] for k in keys])
        }
        if keys
        else {}
    )
    states = (
        {
            (r["thread_id"], r["call_id"]): CallState(
                r["call_id"],
                r["call_seq"],
                r["outcome_seq"],
                r["name"],
                json.loads(r["args"]) if r["args"] else {},
            )
            for r in await conn.fetch(_SELECT_CALLS, [c[0] for c in calls], [c[1] for c in calls])
        }
        if calls
        else {}
    )
    session_rows = await conn.fetch(_SELECT_SESSIONS, list(session_ids))
    sessions = {r["session_id"]: r["tenant"] for r in session_rows}
    principals = {r["session_id"]: r["principal_id"] for r in session_rows}
    releases = {r["session_id"]: r["agent_release"] for r in session_rows}
    policies = frozenset(
        (r["tenant"], r["name"]) for r in await conn.fetch(_SELECT_POLICY_NAMES, list(tenants))
    )
    runs: dict[str, RunState] = {}
    active: dict[str, str] = {}
    for r in await conn.fetch(_SELECT_RUNS, list(run_ids), list(session_ids)):
        runs[r["run_id"]] = RunState(r["run_id"], r["session_id"], r["status"], r["main_thread_id"])
        if r["status"] == "active":
            active[r["session_id"]] = r["run_id"]
    metas = {
        r["thread_id"]: ThreadMeta(
            r["thread_id"], r["session_id"], r["role"], r["parent_thread_id"], r["last_seq"]
        )
        for r in await conn.fetch(_SELECT_THREAD_META, list({*thread_ids, *extra_threads}))
    }
    views = await _read_states(conn, thread_ids)
    catalogs = {
        r["session_id"]: (r["revision"], ToolCatalog.model_validate_json(r["body"]))
        for r in await conn.fetch(_SESSION_CATALOGS, list(session_ids))
    }
    operations = (
        frozenset(
            (r["session_id"], r["operation_id"])
            for r in await conn.fetch(
                _SELECT_OPERATIONS, [o[0] for o in operation_ids], [o[1] for o in operation_ids]
            )
        )
        if operation_ids
        else frozenset()
    )
    latest = (
        {
            (r["tenant"], r["release"]): (r["revision"], ToolCatalog.model_validate_json(r["body"]))
            for r in await conn.fetch(
                _LATEST_CATALOGS, [k[0] for k in release_names], [k[1] for k in release_names]
            )
        }
        if release_names
        else {}
    )
    return LedgerReads(
        heads=heads,
        keys=known,
        calls=states,
        sessions=sessions,
        policies=policies,
        runs=runs,
        active_runs=active,
        threads=metas,
        principals=principals,
        releases=releases,
        states=views,
        catalogs=catalogs,
        latest_catalogs=latest,
        operations=operations,
    )


async def read_session_catalog(conn: Conn, session_id: str) -> ToolCatalog | None:
    """The catalog revision a session pinned, if its release has one."""
    row = await conn.fetchrow(_SESSION_CATALOGS, [session_id])
    return None if row is None else ToolCatalog.model_validate_json(row["body"])


async def read_states(conn: Conn, thread_ids: Sequence[str]) -> dict[str, StateView]:
    """Current facts and aggregate versions of threads."""
    return await _read_states(conn, thread_ids)


async def _read_states(conn: Conn, thread_ids: Sequence[str]) -> dict[str, StateView]:
    views: dict[str, StateView] = {}
    for r in await conn.fetch(_SELECT_FACTS, list(thread_ids)):
        view = views.setdefault(r["thread_id"], StateView())
        view.facts[r["path"]] = Fact(
            r["path"],
            json.loads(r["value"]) if r["value"] is not None else None,
            r["status"],
            r["source"],
            r["event_key"],
            r["seq"],
            r["observed_at"],
            r["supersedes"],
            json.loads(r["superseded_value"]) if r["superseded_value"] is not None else None,
            tuple(r["evidence"] or ()),
        )
    for r in await conn.fetch(_SELECT_VERSIONS, list(thread_ids)):
        views.setdefault(r["thread_id"], StateView()).versions[r["aggregate"]] = r["version"]
    return views


async def write_plan(conn: Conn, plan: BatchPlan, *, recorded_by: str, keep_raw: int) -> None:
    """Apply a batch plan inside the caller's transaction; raises RevisionConflict on a moved head."""
    bases: dict[str, int] = {}
    # Sorted so that two recorders bumping the same sessions always lock them in the same order.
    for session_id in sorted(plan.session_counts):
        n = plan.session_counts[session_id]
        policy = plan.session_policies.get(session_id, DEFAULT_POLICY_NAME)
        # The tenant only matters to a session this batch creates; a known one keeps its own.
        tenant = plan.session_tenants.get(session_id, DEFAULT_TENANT)
        bases[session_id] = await conn.fetchval(_BUMP_SESSION, session_id, n, policy, tenant) - n
    for session_id, principal in sorted(plan.principals.items()):
        await conn.execute(_SET_PRINCIPAL, session_id, principal)
    for session_id, release in sorted(plan.releases.items()):
        await conn.execute(_SET_RELEASE, session_id, release)
    for head in plan.heads:
        await _write_head(conn, head)
    for thread_id, meta in plan.new_threads.items():
        await conn.execute(_SET_THREAD_ROLE, thread_id, meta.role, meta.parent_thread_id)
    if plan.blobs:
        await conn.execute(
            _INSERT_BLOBS,
            [b.sha256 for b in plan.blobs],
            [b.content for b in plan.blobs],
            [len(b.content) for b in plan.blobs],
        )
    if plan.records:
        await _insert_records(conn, plan, bases, recorded_by)
    await _write_runs(conn, plan, bases)
    if plan.calls:
        await conn.execute(
            _INSERT_CALLS,
            [c.thread_id for c in plan.calls],
            [c.call_id for c in plan.calls],
            [c.name for c in plan.calls],
            [c.call_seq for c in plan.calls],
            [json.dumps(c.args, ensure_ascii=False) for c in plan.calls],
        )
    if plan.outcomes:
        status = await conn.execute(
            _CLOSE_CALLS,
            [o.thread_id for o in plan.outcomes],
            [o.call_id for o in plan.outcomes],
            [o.outcome_seq for o in plan.outcomes],
            [o.status for o in plan.outcomes],
        )
        if int(status.split()[-1]) != len(plan.outcomes):
            first = plan.outcomes[0]
            raise RevisionConflict(first.thread_id, -1, None)
    for rejection in plan.rejections:
        await DeadLettersRepo.insert(conn, rejection, keep_raw=keep_raw)
    await _write_state(conn, plan)


async def _write_state(conn: Conn, plan: BatchPlan) -> None:
    """Facts, versions and proposals of the batch's state writes, in the records' transaction."""
    for session_id, revision in sorted(plan.session_catalogs.items()):
        await conn.execute(_SET_CATALOG, session_id, revision)
    for r in plan.receipts_requested:
        await conn.execute(
            _INSERT_RECEIPT,
            r.session_id,
            r.operation_id,
            r.thread_id,
            r.call_id,
            r.tool,
            r.request_sha256,
            r.requested_event,
        )
    for d in plan.receipts_finished:
        await conn.execute(
            _FINISH_RECEIPT,
            d.thread_id,
            d.call_id,
            d.status,
            d.finished_event,
            d.response_sha256,
            d.external_ref,
        )
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
        await conn.execute(_INSERT_RUN, run.run_id, run.session_id, run.main_thread_id, through, final)
    for run_id, status in plan.run_statuses.items():
        if run_id not in new and status == "active":
            await conn.execute(_UPDATE_RUN, run_id, status)
    for reset in plan.resets:
        origin = _session_seq_of(plan, bases, reset.thread_id, reset.seq)
        await conn.execute(_RESET_SESSION, reset.session_id, origin)
        await conn.execute(_RESET_VIEWS, reset.session_id, origin)


async def _write_head(conn: Conn, head: HeadWrite) -> None:
    if head.expected_revision is None:
        got = await conn.fetchval(
            _INSERT_HEAD,
            head.thread_id,
            head.session_id,
            head.run_id,
            head.instance_id,
            head.revision,
            head.last_seq,
            head.last_hash,
            head.last_event_key,
            head.user_turns,
            head.model_steps,
        )
    else:
        got = await conn.fetchval(
            _UPDATE_HEAD,
            head.thread_id,
            head.revision,
            head.last_seq,
            head.last_hash,
            head.last_event_key,
            head.expected_revision,
            head.user_turns,
            head.model_steps,
        )
    if got is None:
        actual = await conn.fetchval(_SELECT_REVISION, head.thread_id)
        raise RevisionConflict(head.thread_id, head.expected_revision or 0, actual)


async def _insert_records(conn: Conn, plan: BatchPlan, bases: Mapping[str, int], recorded_by: str) -> None:
    rs = plan.records
    await conn.execute(
        _INSERT_RECORDS,
        [r.thread_id for r in rs],
        [r.seq for r in rs],
        [r.session_id for r in rs],
        [bases[r.session_id] + r.session_ordinal for r in rs],
        [r.run_id for r in rs],
        [r.instance_id for r in rs],
        [r.event_key for r in rs],
        [r.kind for r in rs],
        [r.payload_json for r in rs],
        [r.text for r in rs],
        [r.blob_sha256 for r in rs],
        [r.view_text for r in rs],
        [r.tokens.o200k_base for r in rs],
        [r.tokens.cl100k_base for r in rs],
        [r.content_sha256 for r in rs],
        [r.prev_hash for r in rs],
        [r.record_hash for r in rs],
        [r.client_ts for r in rs],
        [r.stream_seq for r in rs],
        [recorded_by] * len(rs),
        [r.mask_text for r in rs],
        [r.mask_tokens.o200k_base if r.mask_tokens else None for r in rs],
        [r.mask_tokens.cl100k_base if r.mask_tokens else None for r in rs],
    )
