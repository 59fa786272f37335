"""Repositories of policies, summaries and thread views (the compaction state). Only SQL here."""

from __future__ import annotations

import json
from collections import OrderedDict
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from pydantic import TypeAdapter

from contracts import ContextPolicy, SummaryHook
from contracts.subjects import DEFAULT_TENANT
from contracts.task_budgets import TaskBudget

from services.core.compaction.merge import summary_sources
from services.core.compaction.model import StructuredSummary
from services.core.compaction.policy import Counters, Throttle
from contracts.exceptions import RevisionConflict
from services.killpoints import kill_point
from services.store.ledger import Conn, Row

__all__ = [
    "Candidate",
    "DEFAULT_SUMMARY_CACHE_BYTES",
    "NewSummary",
    "SCOPE_COLUMNS",
    "SummaryRow",
    "SummaryRows",
    "ThreadScope",
    "VIEW_COLUMNS",
    "ViewState",
    "adopt",
    "candidates",
    "clear_pending",
    "commit_summary",
    "ensure_view",
    "get_policy",
    "held_summary_id",
    "load_view",
    "mark_evaluated",
    "note_prepare_budget",
    "parse_summary_hooks",
    "record_attempt",
    "register_policy",
    "scope_of",
    "scope_of_row",
    "session_policy",
    "set_pending",
    "stale_threads",
    "summary_chain",
    "summary_count",
    "summary_hooks_json",
    "summary_id_of",
    "summary_of_row",
    "view_of_row",
    "view_state_of_row",
]

# What scope_of_row reads, of ``ctx.thread_heads h``, ``ctx.sessions s`` and ``ctx.runs r``.
SCOPE_COLUMNS = """h.role, h.parent_thread_id, s.tenant, s.principal_id, s.reset_seq,
       COALESCE(r.snapshot_through, 0) AS snapshot_through, r.status AS run_status, r.task_budget"""
_THREAD_SCOPE = f"""
SELECT {SCOPE_COLUMNS}
FROM ctx.thread_heads h
JOIN ctx.sessions s ON s.session_id = h.session_id
LEFT JOIN ctx.runs r ON r.run_id = h.run_id
WHERE h.thread_id = $1
"""
_CANDIDATES = """
SELECT v.thread_id, v.summary_id, v.covered_to, v.baseline_watermark
FROM ctx.thread_views v
JOIN ctx.thread_heads h ON h.thread_id = v.thread_id
JOIN ctx.summaries s ON s.summary_id = v.summary_id
WHERE h.session_id = $1 AND h.role = 'main' AND v.thread_id <> $2 AND v.covered_to <= $3
ORDER BY v.covered_to DESC, v.thread_id
LIMIT 8
"""
_ADOPT = """
INSERT INTO ctx.thread_views (thread_id, view_revision, summary_id, covered_to, baseline_watermark)
VALUES ($1, 1, $2, $3, $4)
ON CONFLICT (thread_id) DO UPDATE
SET view_revision = ctx.thread_views.view_revision + 1, summary_id = EXCLUDED.summary_id,
    covered_to = EXCLUDED.covered_to, baseline_watermark = EXCLUDED.baseline_watermark, updated_at = now()
WHERE ctx.thread_views.view_revision = $5 AND ctx.thread_views.summary_id IS NULL
RETURNING view_revision
"""


@dataclass(frozen=True, slots=True)
class ThreadScope:
    """Where a thread stands in its session: role, parent, snapshot boundary, principal, reset fence."""

    role: str = "main"
    parent_thread_id: str | None = None
    tenant: str = DEFAULT_TENANT
    principal_id: str | None = None
    reset_seq: int = 0
    snapshot_through: int = 0
    run_status: str | None = None
    # The budget the run declared on its first event (``ctx.runs.task_budget``), for every thread of the run.
    task_budget: TaskBudget | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    """An earlier run's current summary that a new run may inherit if it covers a prefix of its records."""

    thread_id: str
    summary_id: str
    covered_to: int
    baseline_watermark: int


async def scope_of(conn: Conn, thread_id: str) -> ThreadScope:
    r = await conn.fetchrow(_THREAD_SCOPE, thread_id)
    return ThreadScope() if r is None else scope_of_row(r)


def scope_of_row(r: Row) -> ThreadScope:
    """A scope from a row with ``SCOPE_COLUMNS``."""
    return ThreadScope(
        r["role"],
        r["parent_thread_id"],
        r["tenant"],
        r["principal_id"],
        r["reset_seq"],
        r["snapshot_through"],
        r["run_status"],
        None if r["task_budget"] is None else TaskBudget.model_validate_json(r["task_budget"]),
    )


# A tenant sees its own policies and the shared built-ins (tenant ''); revisions number across both.
_SELECT_POLICY = (
    "SELECT revision, body FROM ctx.policies WHERE tenant IN ($1, '') AND name = $2 AND revision = $3"
)
_LATEST_POLICY = """
SELECT revision, body FROM ctx.policies WHERE tenant IN ($1, '') AND name = $2 ORDER BY revision DESC LIMIT 1
"""
_INSERT_POLICY = """
INSERT INTO ctx.policies (tenant, name, revision, body)
SELECT $1, $2, COALESCE(max(revision), 0) + 1, $3::jsonb FROM ctx.policies
WHERE tenant IN ($1, '') AND name = $2
RETURNING revision
"""
_SESSION_POLICY = "SELECT tenant, policy_name, policy_revision FROM ctx.sessions WHERE session_id = $1"
_ENSURE_VIEW = "INSERT INTO ctx.thread_views (thread_id) VALUES ($1) ON CONFLICT (thread_id) DO NOTHING"
# What view_state_of_row reads, of ``ctx.thread_views v`` and ``ctx.summaries sm`` (left joined),
# asked with $2 = the id of the summary the store holds: its body and text are then not sent again.
VIEW_COLUMNS = """v.view_revision, v.summary_id, v.covered_to, v.baseline_user_turns, v.baseline_model_steps,
       v.baseline_watermark, v.evaluated_revision, v.pending_fingerprint, v.pending_since, v.throttle,
       v.deferred_reason, v.attempts, v.failures, v.last_failure, v.prepare_budget, v.prepare_reserved,
       v.summary_id IS NOT DISTINCT FROM $2::uuid AS summary_held,
       CASE WHEN v.summary_id IS DISTINCT FROM $2::uuid THEN sm.body::text END AS summary_body,
       CASE WHEN v.summary_id IS DISTINCT FROM $2::uuid THEN sm.text END AS summary_text,
       sm.tokens_o200k AS summary_o200k, sm.tokens_cl100k AS summary_cl100k,
       sm.covered_from AS summary_from, sm.hooks::text AS summary_hooks,
       extract(epoch FROM now() - v.pending_since) AS pending_age_s"""
_SELECT_VIEW = f"""
SELECT {VIEW_COLUMNS}
FROM ctx.thread_views v LEFT JOIN ctx.summaries sm ON sm.summary_id = v.summary_id
WHERE v.thread_id = $1
"""
_SET_PENDING = """
UPDATE ctx.thread_views SET pending_fingerprint = $2, pending_since = now(), updated_at = now()
WHERE thread_id = $1 AND (pending_fingerprint IS NULL OR pending_since < now() - make_interval(secs => $3))
RETURNING view_revision
"""
_CLEAR_PENDING = """
UPDATE ctx.thread_views SET pending_fingerprint = NULL, pending_since = NULL
WHERE thread_id = $1 AND pending_fingerprint = $2
"""
_MARK_EVALUATED = """
UPDATE ctx.thread_views SET evaluated_revision = GREATEST(evaluated_revision, $2) WHERE thread_id = $1
"""
_SET_THROTTLE = """
UPDATE ctx.thread_views
SET throttle = $2::jsonb, deferred_reason = $3, attempts = attempts + $4, failures = failures + $5,
    last_failure = COALESCE($6, last_failure), updated_at = now(),
    pending_fingerprint = CASE WHEN pending_fingerprint = $7 THEN NULL ELSE pending_fingerprint END,
    pending_since = CASE WHEN pending_fingerprint = $7 THEN NULL ELSE pending_since END
WHERE thread_id = $1
"""
_INSERT_SUMMARY = """
INSERT INTO ctx.summaries (summary_id, thread_id, view_revision, parent_summary_id, covered_from, covered_to,
    source_watermark, policy_name, policy_revision, body, text, tokens_o200k, tokens_cl100k, summarizer,
    calls, trigger_reasons, tokens_before, tokens_after, target_reached, job_id, hooks)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
    $21::jsonb)
"""
_COMMIT_VIEW = """
UPDATE ctx.thread_views
SET view_revision = $3, summary_id = $4, covered_to = $5, baseline_user_turns = $6, baseline_model_steps = $7,
    baseline_watermark = $8, throttle = $9::jsonb, deferred_reason = NULL, attempts = attempts + 1,
    pending_fingerprint = NULL, pending_since = NULL, updated_at = now()
WHERE thread_id = $1 AND view_revision = $2
RETURNING view_revision
"""
_VIEW_REVISION = "SELECT view_revision FROM ctx.thread_views WHERE thread_id = $1"
_POINT_VIEW = "UPDATE ctx.thread_views SET summary_id = $2 WHERE thread_id = $1"
_STALE_THREADS = """
SELECT h.thread_id FROM ctx.thread_heads h LEFT JOIN ctx.thread_views v USING (thread_id)
WHERE h.revision > COALESCE(v.evaluated_revision, 0)
ORDER BY h.updated_at LIMIT $1
"""
_SUMMARY_COUNT = "SELECT count(*) FROM ctx.summaries WHERE thread_id = $1"
# The summaries a summary extends, parent first and oldest last (adopted ones of other threads too).
_SUMMARY_CHAIN = """
WITH RECURSIVE chain AS (
    SELECT parent_summary_id AS summary_id, 1 AS hop FROM ctx.summaries WHERE summary_id = $1::uuid
    UNION ALL
    SELECT s.parent_summary_id, c.hop + 1 FROM ctx.summaries s JOIN chain c ON s.summary_id = c.summary_id
)
SELECT s.summary_id, s.view_revision, s.body::text AS body, s.text, s.tokens_o200k, s.tokens_cl100k,
       s.hooks::text AS hooks
FROM chain c JOIN ctx.summaries s ON s.summary_id = c.summary_id
ORDER BY c.hop
"""
_NOTE_PREPARE_BUDGET = """
UPDATE ctx.thread_views SET prepare_budget = $2, prepare_reserved = $3
WHERE thread_id = $1 AND (prepare_budget IS DISTINCT FROM $2 OR prepare_reserved <> $3)
"""


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """The committed summary a view shows."""

    summary_id: str
    body: StructuredSummary
    text: str
    tokens_o200k: int
    tokens_cl100k: int
    # The hooks that narrowed or patched it.
    hooks: tuple[SummaryHook, ...] = ()
    # Every record seq the body cites, sorted: walked once per summary, not on every prepare (where it
    # would be 15 % of a compacted 500-record thread's prepare).
    sources: tuple[int, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(summary_sources(self.body)))

    def tokens(self, encoding: str) -> int:
        return self.tokens_cl100k if encoding == "cl100k_base" else self.tokens_o200k


def summary_of_row(r: Row) -> SummaryRow:
    """A summary from a ``ctx.summaries`` row."""
    return SummaryRow(
        str(r["summary_id"]),
        StructuredSummary.model_validate_json(r["body"]),
        r["text"],
        r["tokens_o200k"],
        r["tokens_cl100k"],
        parse_summary_hooks(r.get("hooks")),
    )


@dataclass(frozen=True, slots=True)
class ViewState:
    """A thread's compaction state."""

    view_revision: int = 0
    summary: SummaryRow | None = None
    covered_to: int = 0
    baseline: Counters = Counters()
    baseline_watermark: int = 0
    evaluated_revision: int = 0
    pending_fingerprint: str | None = None
    pending_age_s: float | None = None
    throttle: Throttle | None = None
    deferred_reason: str | None = None
    attempts: int = 0
    failures: int = 0
    last_failure: str | None = None
    # The smaller budget (and tool-schema reservation) the thread's prepares last had to wait under.
    prepare_budget: int | None = None
    prepare_reserved: int = 0


@dataclass(frozen=True, slots=True)
class NewSummary:
    """A validated candidate ready to commit."""

    thread_id: str
    parent_summary_id: str | None
    body: StructuredSummary
    text: str
    tokens_o200k: int
    tokens_cl100k: int
    covered_to: int
    source_watermark: int
    policy_name: str
    policy_revision: int
    summarizer: str
    calls: int
    trigger_reasons: tuple[str, ...]
    tokens_before: int
    tokens_after: int
    target_reached: bool
    job_id: str
    baseline: Counters
    throttle: Throttle | None
    # The compact.before hooks that narrowed it and the compact.after hooks that patched it, in order.
    hooks: tuple[SummaryHook, ...] = ()


_HOOKS = TypeAdapter(tuple[SummaryHook, ...])


def summary_hooks_json(hooks: tuple[SummaryHook, ...]) -> str:
    """The ``summaries.hooks`` column of a summary (a JSON array; ``[]`` when no hook shaped it)."""
    return _HOOKS.dump_json(hooks, exclude_defaults=True).decode()


def parse_summary_hooks(text: str | None) -> tuple[SummaryHook, ...]:
    """The hooks stored with a summary (none for a row from before they were recorded)."""
    return _HOOKS.validate_json(text) if text else ()


# Enough for the summaries of a process's busy threads; a thread whose summary fell out reads it again.
DEFAULT_SUMMARY_CACHE_BYTES = 32 * 1024 * 1024


class SummaryRows:
    """The summary each thread's view showed when this store last read it, bounded by bytes.

    A summary never changes once committed (a new one gets a new id), so a view that still shows the
    one held here is read without its body and text, sparing every prepare of a compacted thread the
    0.6 ms of sending and parsing a ~100 KB summary again. One per store, so one per
    database: two databases in one process may hold equal summary ids (tests, benchmarks).
    """

    def __init__(self, max_bytes: int = DEFAULT_SUMMARY_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._rows: OrderedDict[str, tuple[SummaryRow, int]] = OrderedDict()
        # What the held summaries cost, as their sizes were given.
        self.bytes = 0

    def held(self, thread_id: str) -> SummaryRow | None:
        found = self._rows.get(thread_id)
        if found is None:
            return None
        self._rows.move_to_end(thread_id)
        return found[0]

    def keep(self, thread_id: str, row: SummaryRow, size: int) -> None:
        """Hold ``row`` as the thread's summary (``size``: about what it costs in memory)."""
        previous = self._rows.pop(thread_id, None)
        if previous is not None:
            self.bytes -= previous[1]
        if size > self.max_bytes:
            return
        self._rows[thread_id] = (row, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._rows.popitem(last=False)
            self.bytes -= dropped


def held_summary_id(held: SummaryRow | None) -> uuid.UUID | None:
    """The parameter that spares reading a held summary's body again."""
    return uuid.UUID(held.summary_id) if held is not None else None


def view_state_of_row(
    thread_id: str, r: asyncpg.Record, held: SummaryRow | None, summaries: SummaryRows | None
) -> ViewState:
    """A view state from a row with ``VIEW_COLUMNS``, asked with ``held``'s id."""
    summary = None
    if r["summary_id"] is not None and held is not None and r["summary_held"]:
        summary = held
    elif r["summary_id"] is not None:
        body: str = r["summary_body"]
        summary = SummaryRow(
            summary_id=str(r["summary_id"]),
            body=StructuredSummary.model_validate_json(body),
            text=r["summary_text"],
            tokens_o200k=r["summary_o200k"],
            tokens_cl100k=r["summary_cl100k"],
            hooks=parse_summary_hooks(r["summary_hooks"]),
        )
        if summaries is not None:
            # The parsed body costs a few times its JSON; the text once more.
            summaries.keep(thread_id, summary, 4 * len(body) + len(summary.text))
    return view_of_row(r, summary)


def view_of_row(r: Row, summary: SummaryRow | None) -> ViewState:
    """A view state from a ``ctx.thread_views`` row (with ``pending_age_s``) and the summary it shows."""
    throttle: dict[str, Any] | None = json.loads(r["throttle"]) if r["throttle"] else None
    return ViewState(
        view_revision=r["view_revision"],
        summary=summary,
        covered_to=r["covered_to"],
        baseline=Counters(r["baseline_user_turns"], r["baseline_model_steps"]),
        baseline_watermark=r["baseline_watermark"],
        evaluated_revision=r["evaluated_revision"],
        pending_fingerprint=r["pending_fingerprint"],
        pending_age_s=float(r["pending_age_s"]) if r["pending_age_s"] is not None else None,
        throttle=Throttle.from_json(throttle) if throttle else None,
        deferred_reason=r["deferred_reason"],
        attempts=r["attempts"],
        failures=r["failures"],
        last_failure=r["last_failure"],
        prepare_budget=r["prepare_budget"],
        prepare_reserved=r["prepare_reserved"],
    )


async def register_policy(conn: Conn, tenant: str, policy: ContextPolicy) -> int:
    """Store ``policy`` as the next revision of its name in ``tenant``; returns the revision."""
    return int(await conn.fetchval(_INSERT_POLICY, tenant, policy.name, policy.model_dump_json()))


async def get_policy(
    conn: Conn, tenant: str, name: str, revision: int | None = None
) -> tuple[int, ContextPolicy] | None:
    """A revision of a policy ``tenant`` may use (the latest when ``revision`` is None)."""
    row = await (
        conn.fetchrow(_LATEST_POLICY, tenant, name)
        if revision is None
        else conn.fetchrow(_SELECT_POLICY, tenant, name, revision)
    )
    if row is None:
        return None
    return int(row["revision"]), ContextPolicy.model_validate_json(row["body"])


async def session_policy(conn: Conn, session_id: str) -> tuple[str, str, int] | None:
    """The tenant of a session, and the policy name and revision it pinned."""
    row = await conn.fetchrow(_SESSION_POLICY, session_id)
    return None if row is None else (str(row["tenant"]), str(row["policy_name"]), int(row["policy_revision"]))


# Summary ids are derived, not drawn: a re-run of the same commit names the same summary.
_SUMMARY_NAMESPACE = uuid.UUID("6a1f3c5e-2b7d-4e8a-9c0f-5d4b3a2e1f60")


def summary_id_of(thread_id: str, view_revision: int, covered_from: int, covered_to: int) -> str:
    """The id of the summary a thread commits at ``view_revision`` covering ``covered_from..covered_to``.

    Unique per committed summary: a thread commits at most one summary per view revision
    (``summaries_revision``), and revisions only grow, resets included.
    """
    return str(
        uuid.uuid5(_SUMMARY_NAMESPACE, f"{thread_id}\x1f{view_revision}\x1f{covered_from}\x1f{covered_to}")
    )


def _throttle_json(throttle: Throttle | None) -> str | None:
    return None if throttle is None else json.dumps(throttle.to_json())


async def load_view(conn: Conn, thread_id: str, summaries: SummaryRows | None = None) -> ViewState:
    """The compaction state of a thread (an empty state if it never had one); the summary's body
    is read only when ``summaries`` does not hold the one the view shows."""
    held = summaries.held(thread_id) if summaries is not None else None
    r = await conn.fetchrow(_SELECT_VIEW, thread_id, held_summary_id(held))
    return ViewState() if r is None else view_state_of_row(thread_id, r, held, summaries)


async def summary_chain(conn: Conn, summary_id: str) -> list[tuple[int, SummaryRow]]:
    rows = await conn.fetch(_SUMMARY_CHAIN, summary_id)
    return [
        (
            r["view_revision"],
            summary_of_row(r),
        )
        for r in rows
    ]


async def note_prepare_budget(conn: Conn, thread_id: str, budget: int, reserved: int) -> None:
    """Remember the budget a prepare had to wait under (a no-op write when it is unchanged)."""
    await conn.execute(_NOTE_PREPARE_BUDGET, thread_id, budget, reserved)


async def ensure_view(conn: Conn, thread_id: str) -> None:
    await conn.execute(_ENSURE_VIEW, thread_id)


async def set_pending(conn: Conn, thread_id: str, fingerprint: str, *, stale_after_s: float) -> bool:
    """Claim the thread's one pending-job slot; False if another job holds it."""
    return await conn.fetchval(_SET_PENDING, thread_id, fingerprint, stale_after_s) is not None


async def clear_pending(conn: Conn, thread_id: str, fingerprint: str) -> None:
    """Release the slot if ``fingerprint`` still holds it."""
    await conn.execute(_CLEAR_PENDING, thread_id, fingerprint)


async def mark_evaluated(conn: Conn, thread_id: str, head_revision: int) -> None:
    """The budgeter has looked at the thread up to ``head_revision``."""
    await conn.execute(_MARK_EVALUATED, thread_id, head_revision)


async def record_attempt(
    conn: Conn,
    thread_id: str,
    *,
    throttle: Throttle | None,
    reason: str | None,
    failed: bool,
    fingerprint: str | None,
    counts_as_attempt: bool = True,
) -> None:
    """Remember an attempt that did not commit (deferred or failed); never moves the baseline."""
    await conn.execute(
        _SET_THROTTLE,
        thread_id,
        _throttle_json(throttle),
        reason,
        int(counts_as_attempt),
        int(failed),
        reason if failed else None,
        fingerprint or "",
    )


async def commit_summary(conn: Conn, expected_revision: int, s: NewSummary) -> str:
    """Insert the summary and point the view at it, if the view is still at ``expected_revision``."""
    new_revision = expected_revision + 1
    summary_id = summary_id_of(s.thread_id, new_revision, s.body.covered_from, s.covered_to)
    async with conn.transaction():
        # A thread no budgeter pass has evaluated yet (a manual compaction right after its events:
        # passes wait for a quiet moment) has no view row to compare and set, as with a window.
        await conn.execute(_ENSURE_VIEW, s.thread_id)
        got = await conn.fetchval(
            _COMMIT_VIEW,
            s.thread_id,
            expected_revision,
            new_revision,
            None,
            s.covered_to,
            s.baseline.user_turns,
            s.baseline.model_steps,
            s.source_watermark,
            _throttle_json(s.throttle),
        )
        if got is None:
            actual = await conn.fetchval(_VIEW_REVISION, s.thread_id)
            raise RevisionConflict(s.thread_id, expected_revision, actual)
        await conn.execute(
            _INSERT_SUMMARY,
            uuid.UUID(summary_id),
            s.thread_id,
            new_revision,
            uuid.UUID(s.parent_summary_id) if s.parent_summary_id else None,
            s.body.covered_from,
            s.covered_to,
            s.source_watermark,
            s.policy_name,
            s.policy_revision,
            s.body.model_dump_json(),
            s.text,
            s.tokens_o200k,
            s.tokens_cl100k,
            s.summarizer,
            s.calls,
            list(s.trigger_reasons),
            s.tokens_before,
            s.tokens_after,
            s.target_reached,
            s.job_id,
            summary_hooks_json(s.hooks),
        )
        await conn.execute(_POINT_VIEW, s.thread_id, uuid.UUID(summary_id))
        kill_point("compact.before_commit")
    kill_point("compact.after_commit")
    return summary_id


async def candidates(conn: Conn, session_id: str, thread_id: str, through: int) -> list[Candidate]:
    """Other main threads' current summaries that lie within ``through``, newest coverage first."""
    return [
        Candidate(r["thread_id"], str(r["summary_id"]), r["covered_to"], r["baseline_watermark"])
        for r in await conn.fetch(_CANDIDATES, session_id, thread_id, through)
    ]


async def adopt(conn: Conn, thread_id: str, expected_revision: int, candidate: Candidate) -> bool:
    """Point a thread's fresh view at an inherited summary (and its baseline); False if it moved on."""
    got = await conn.fetchval(
        _ADOPT,
        thread_id,
        uuid.UUID(candidate.summary_id),
        candidate.covered_to,
        candidate.baseline_watermark,
        expected_revision,
    )
    return got is not None


async def stale_threads(conn: Conn, limit: int) -> list[str]:
    """Threads recorded past what the budgeter evaluated (catch-up after missed notices)."""
    return [r["thread_id"] for r in await conn.fetch(_STALE_THREADS, limit)]


async def summary_count(conn: Conn, thread_id: str) -> int:
    return int(await conn.fetchval(_SUMMARY_COUNT, thread_id))
