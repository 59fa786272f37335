"""A plan's ledger writes in one statement: sessions, heads, records, tool calls, receipts and the position.

Each statement of a batch is a round trip, and the recorder's transaction is on every read-your-writes
step: as separate statements, one event on a known thread is BEGIN, session bump, head
compare-and-set, records, position, COMMIT. Here they are the sub-statements of one ``WITH``,
composed from the parts the plan has; a plan with nothing else to write (``one_statement``) needs no
transaction around it at all.

Invariants:

1. A record, a tool call, a call's outcome and a settled receipt are written only for a thread whose
   head this statement created or moved (``w``): a thread that lost its compare-and-set writes nothing
   of its own, so the loss is reported as a conflict (``RevisionConflict``), never as a unique
   violation on a sequence the winner took.
2. A lost head, or an outcome whose call another writer closed, fails the whole statement from
   inside it (``ctx.require_written``): what it did write — the sessions' numbers, the
   position — goes with it, with or without a transaction around it.
3. Sub-statements of one ``WITH`` see one snapshot, not each other's rows: an outcome whose call is
   in the same plan is written with the call (``_fold_outcomes``), since the update closing calls
   could not see it; receipts are settled here only when the plan requests none
   (``settles_receipts``), since the settling update could not see a receipt requested beside it.
4. The sessions' bump is read by the records' insert (their session sequence numbers) and returned,
   so the caller has each session's base for runs and resets.
5. A statement that moves a consumer's position commits without waiting for the WAL flush
   (``synchronous_commit`` off for its transaction): everything it writes is derived
   from events the broker stored durably before acking them, so a crash that loses the commit loses
   the position with it, and the recorder reads those events again (``PositionRegressed``). Nothing
   that commits after it can survive without it: the WAL is flushed in order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from contracts import DEFAULT_POLICY_NAME
from contracts.subjects import DEFAULT_TENANT

import asyncpg
import orjson

from services.core.ledger import BatchPlan, NewCall, NewOutcome, writes_only_its_threads
from contracts.exceptions import RevisionConflict
from services.store.ledger import Conn

__all__ = [
    "FINISHED_RECEIPT",
    "unnest_args",
    "LedgerWritten",
    "Position",
    "one_statement",
    "settles_receipts",
    "write_ledger",
]


@dataclass(frozen=True)
class LedgerWritten:
    """What a committed ``write_ledger`` tells beyond the plan: each session's base (the sequence
    number its first record follows) and the statement's clock (its records' ``recorded_at``)."""

    bases: Mapping[str, int]
    at: datetime


@dataclass(frozen=True)
class Position:
    """The consumer position the batch moves to, written with its records."""

    consumer: str
    partition: int
    stream_seq: int


_SESSIONS = """
s AS (
  INSERT INTO ctx.sessions (session_id, last_seq, policy_name, policy_revision, tenant)
  SELECT u.session_id, u.n, u.policy,
         (SELECT max(revision) FROM ctx.policies WHERE name = u.policy AND tenant IN (u.tenant, '')),
         u.tenant
  FROM unnest({0}::text[], {1}::bigint[], {2}::text[], {3}::text[]) AS u(session_id, n, policy, tenant)
  -- Sessions in one order, so two recorders bumping the same ones (a partition changing hands)
  -- always lock them in that order.
  ORDER BY u.session_id
  ON CONFLICT (session_id) DO UPDATE SET last_seq = ctx.sessions.last_seq + EXCLUDED.last_seq
  RETURNING session_id, last_seq)"""

_NEW_HEADS = """
hn AS (
  INSERT INTO ctx.thread_heads
      (thread_id, session_id, run_id, instance_id, revision, last_seq, last_hash, last_event_key,
       user_turns, model_steps)
  SELECT * FROM unnest({0}::text[], {1}::text[], {2}::text[], {3}::text[], {4}::bigint[], {5}::bigint[],
                       {6}::text[], {7}::text[], {8}::integer[], {9}::integer[])
  ON CONFLICT (thread_id) DO NOTHING
  RETURNING thread_id)"""

_MOVED_HEADS = """
hm AS (
  UPDATE ctx.thread_heads h
  SET revision = u.revision, last_seq = u.last_seq, last_hash = u.last_hash, last_event_key = u.last_key,
      updated_at = now(), user_turns = h.user_turns + u.turns, model_steps = h.model_steps + u.steps
  FROM unnest({0}::text[], {1}::bigint[], {2}::bigint[], {3}::text[], {4}::text[], {5}::bigint[],
              {6}::integer[], {7}::integer[])
       AS u(thread_id, revision, last_seq, last_hash, last_key, expected, turns, steps)
  WHERE h.thread_id = u.thread_id AND h.revision = u.expected
  RETURNING h.thread_id)"""

# The records come as one JSON array (``_records_json``), not as 23 arrays: asyncpg encodes an array
# element by element, asking each whether it is itself an array (three ABC isinstance checks), which is
# 6 % of the recorder's time in a backlog. A field typed ``json`` keeps its text as sent.
_RECORDS = """
r AS (
  INSERT INTO ctx.records (
      thread_id, seq, session_id, session_seq, run_id, instance_id, event_key, kind, payload, text,
      blob_sha256, view_text, tokens_o200k, tokens_cl100k, content_sha256, prev_hash, record_hash,
      client_ts, stream_seq, recorded_by, mask_text, mask_tokens_o200k, mask_tokens_cl100k)
  SELECT u.thread_id, u.seq, u.session_id, s.last_seq - u.n + u.ordinal, u.run_id, u.instance_id,
         u.event_key, u.kind, u.payload, u.text, u.blob, u.view_text, u.o200k, u.cl100k, u.content_sha,
         u.prev_hash, u.record_hash, u.client_ts, u.stream_seq, {1}, u.mask_text, u.mask_o200k,
         u.mask_cl100k
  FROM json_to_recordset({0}::json)
       AS u(thread_id text, seq bigint, session_id text, n bigint, ordinal bigint, run_id text,
            instance_id text, event_key text, kind text, payload json, text text, blob text,
            view_text text, o200k integer, cl100k integer, content_sha text, prev_hash text,
            record_hash text, client_ts timestamptz, stream_seq bigint, mask_text text,
            mask_o200k integer, mask_cl100k integer)
  JOIN s ON s.session_id = u.session_id
  WHERE u.thread_id IN (SELECT thread_id FROM w))"""

_CALLS = """
c AS (
  INSERT INTO ctx.tool_calls (thread_id, call_id, name, call_seq, args, outcome_seq, status)
  -- The arguments as text[], cast here: a json[] parameter costs the driver a type lookup per connection.
  SELECT u.thread_id, u.call_id, u.name, u.call_seq, u.args::json, u.outcome_seq, u.status
  FROM unnest({0}::text[], {1}::text[], {2}::text[], {3}::bigint[], {4}::text[], {5}::bigint[],
              {6}::text[]) AS u(thread_id, call_id, name, call_seq, args, outcome_seq, status)
  WHERE u.thread_id IN (SELECT thread_id FROM w))"""

_OUTCOMES = """
o AS (
  UPDATE ctx.tool_calls t SET outcome_seq = u.seq, status = u.status
  FROM unnest({0}::text[], {1}::text[], {2}::bigint[], {3}::text[]) AS u(thread_id, call_id, seq, status)
  WHERE t.thread_id = u.thread_id AND t.call_id = u.call_id AND t.outcome_seq IS NULL
    AND u.thread_id IN (SELECT thread_id FROM w)
  RETURNING 1)"""

_RECEIPTS = """
d AS (
  UPDATE ctx.receipts t
  SET status = u.status, finished_event = u.finished_event, response_sha256 = u.response_sha256,
      external_ref = u.external_ref
  FROM unnest({0}::text[], {1}::text[], {2}::text[], {3}::text[], {4}::text[], {5}::text[])
      AS u(thread_id, call_id, status, finished_event, response_sha256, external_ref)
  WHERE t.thread_id = u.thread_id AND t.call_id = u.call_id AND u.thread_id IN (SELECT thread_id FROM w))"""

_POSITION = """
p AS (
  INSERT INTO ctx.tracking (consumer, partition, last_stream_seq) VALUES ({0}, {1}, {2})
  ON CONFLICT (consumer, partition) DO UPDATE
  SET last_stream_seq = GREATEST(ctx.tracking.last_stream_seq, EXCLUDED.last_stream_seq),
      updated_at = now())"""

# The guard's failures (``ctx.require_written``).
_LOST_HEAD = "CX001"
_CALL_CLOSED = "CX002"

# A new head's columns, in _NEW_HEADS's order.
_HEAD_FIELDS = (
    "thread_id",
    "session_id",
    "run_id",
    "instance_id",
    "revision",
    "last_seq",
    "last_hash",
    "last_event_key",
)


@dataclass
class _Statement:
    """A ``WITH`` of sub-statements and their arguments, numbered as they are added."""

    ctes: list[str] = field(default_factory=list)
    args: list[object] = field(default_factory=list)

    def add(self, template: str, *values: object) -> None:
        first = len(self.args) + 1
        self.args.extend(values)
        self.ctes.append(template.format(*(f"${first + i}" for i in range(len(values)))))

    def sql(self, select: str) -> str:
        return "WITH" + ",".join(self.ctes) + "\n" + select


def one_statement(plan: BatchPlan) -> bool:
    """True when ``write_ledger`` writes all of ``plan``: it commits by itself, no transaction needed."""
    return not plan.blobs and writes_only_its_threads(plan)


def settles_receipts(plan: BatchPlan) -> bool:
    """True when ``write_ledger`` settles the plan's finished receipts (invariant 3): it requests none."""
    return not plan.receipts_requested


async def write_ledger(
    conn: Conn, plan: BatchPlan, recorded_by: str, position: Position | None
) -> LedgerWritten:
    """Sessions, heads, records, calls and ``position`` of ``plan`` in one statement (with its settled
    receipts too when ``settles_receipts(plan)``); each session's base and the statement's clock.

    Raises RevisionConflict naming the first thread whose head another writer moved or created; the
    statement then wrote nothing (invariant 2).
    """
    statement = _Statement()
    if plan.session_counts:
        ids = sorted(plan.session_counts)
        statement.add(
            _SESSIONS,
            ids,
            [plan.session_counts[s] for s in ids],
            [plan.session_policies.get(s, DEFAULT_POLICY_NAME) for s in ids],
            # The tenant only matters to a session this batch creates; a known one keeps its own.
            [plan.session_tenants.get(s, DEFAULT_TENANT) for s in ids],
        )
    fresh = [h for h in plan.heads if h.expected_revision is None]
    moved = [h for h in plan.heads if h.expected_revision is not None]
    written: list[str] = []
    if fresh:
        statement.add(_NEW_HEADS, *unnest_args(fresh, *_HEAD_FIELDS, "user_turns", "model_steps"))
        written.append("SELECT thread_id FROM hn")
    if moved:
        statement.add(
            _MOVED_HEADS,
            *unnest_args(moved, "thread_id", "revision", "last_seq", "last_hash", "last_event_key"),
            *unnest_args(moved, "expected_revision", "user_turns", "model_steps"),
        )
        written.append("SELECT thread_id FROM hm")
    statement.ctes.append(
        "\nw AS (" + (" UNION ALL ".join(written) or "SELECT NULL::text AS thread_id WHERE false") + ")"
    )
    if plan.records:
        statement.add(_RECORDS, _records_json(plan), recorded_by)
    calls, outcomes = _fold_outcomes(plan.calls, plan.outcomes)
    if calls:
        statement.add(
            _CALLS,
            [c.thread_id for c, _ in calls],
            [c.call_id for c, _ in calls],
            [c.name for c, _ in calls],
            [c.call_seq for c, _ in calls],
            [json.dumps(c.args, ensure_ascii=False) for c, _ in calls],
            [o.outcome_seq if o is not None else None for _, o in calls],
            [o.status if o is not None else None for _, o in calls],
        )
    if outcomes:
        statement.add(_OUTCOMES, *unnest_args(outcomes, "thread_id", "call_id", "outcome_seq", "status"))
    if plan.receipts_finished and settles_receipts(plan):
        statement.add(_RECEIPTS, *unnest_args(plan.receipts_finished, *FINISHED_RECEIPT))
    if position is not None:
        statement.add(_POSITION, position.consumer, position.partition, position.stream_seq)
    bumped = "(SELECT json_object_agg(session_id, last_seq) FROM s)::text" if plan.session_counts else "NULL"
    # Local to the transaction: the statement's own when it commits by itself (invariant 5).
    unflushed = ", set_config('synchronous_commit', 'off', true)" if position is not None else ""
    closed = "(SELECT count(*) FROM o)" if outcomes else "0"
    heads, to_close = len(statement.args) + 1, len(statement.args) + 2
    statement.args += [[h.thread_id for h in plan.heads], len(outcomes)]
    guard = f"""ctx.require_written(l.thread_id,
    (SELECT revision FROM ctx.thread_heads WHERE thread_id = l.thread_id), {closed}, ${to_close})
FROM (SELECT (SELECT t FROM unnest(${heads}::text[]) AS t
              WHERE t NOT IN (SELECT thread_id FROM w) LIMIT 1) AS thread_id) l"""
    try:
        row = await conn.fetchrow(
            statement.sql(f"SELECT {bumped}, now(){unflushed}, {guard}"), *statement.args
        )
    except asyncpg.PostgresError as exc:
        raise _conflict(exc, plan, outcomes) from None
    assert row is not None
    last_seqs: Mapping[str, int] = json.loads(row[0]) if row[0] is not None else {}
    return LedgerWritten({s: last_seqs[s] - n for s, n in plan.session_counts.items()}, row[1])


def _conflict(exc: asyncpg.PostgresError, plan: BatchPlan, outcomes: Sequence[NewOutcome]) -> Exception:
    """The guard's failure as the conflict it reports; any other error as it was raised."""
    state = getattr(exc, "sqlstate", None)
    if state == _LOST_HEAD:
        thread_id = str(getattr(exc, "message", ""))
        expected = next((h.expected_revision for h in plan.heads if h.thread_id == thread_id), None)
        detail = getattr(exc, "detail", None)
        return RevisionConflict(thread_id, expected or 0, int(detail) if detail else None)
    if state == _CALL_CLOSED:
        return RevisionConflict(outcomes[0].thread_id, -1, None)
    return exc


# A finished receipt's columns, as both statements that settle receipts take them.
FINISHED_RECEIPT = ("thread_id", "call_id", "status", "finished_event", "response_sha256", "external_ref")


def unnest_args(rows: Sequence[object], *names: str) -> list[list[object]]:
    """One array argument per attribute name, for an ``unnest``."""
    return [[getattr(row, name) for row in rows] for name in names]


def _records_json(plan: BatchPlan) -> str:
    """The plan's records as ``_RECORDS`` reads them: one object each, the payload's JSON as it is."""
    counts = plan.session_counts
    return orjson.dumps(
        [
            {
                "thread_id": r.thread_id,
                "seq": r.seq,
                "session_id": r.session_id,
                "n": counts[r.session_id],
                "ordinal": r.session_ordinal,
                "run_id": r.run_id,
                "instance_id": r.instance_id,
                "event_key": r.event_key,
                "kind": r.kind,
                "payload": orjson.Fragment(r.payload_json),
                "text": r.text,
                "blob": r.blob_sha256,
                "view_text": r.view_text,
                "o200k": r.tokens.o200k_base,
                "cl100k": r.tokens.cl100k_counted,
                "content_sha": r.content_sha256,
                "prev_hash": r.prev_hash,
                "record_hash": r.record_hash,
                # In UTC, as the driver converted it (a naive time is the process's local time there too).
                "client_ts": r.client_ts.astimezone(timezone.utc).isoformat() if r.client_ts else None,
                "stream_seq": r.stream_seq,
                "mask_text": r.mask_text,
                "mask_o200k": r.mask_tokens.o200k_base if r.mask_tokens else None,
                "mask_cl100k": r.mask_tokens.cl100k_counted if r.mask_tokens else None,
            }
            for r in plan.records
        ]
    ).decode()


def _fold_outcomes(
    calls: Sequence[NewCall], outcomes: Sequence[NewOutcome]
) -> tuple[list[tuple[NewCall, NewOutcome | None]], list[NewOutcome]]:
    """Each new call with the outcome the same plan gives it (invariant 2), and the outcomes left to
    close calls recorded earlier."""
    slot = {(c.thread_id, c.call_id): i for i, c in enumerate(calls)}
    folded: list[tuple[NewCall, NewOutcome | None]] = [(c, None) for c in calls]
    earlier: list[NewOutcome] = []
    for outcome in outcomes:
        i = slot.get((outcome.thread_id, outcome.call_id))
        if i is not None and folded[i][1] is None:
            folded[i] = (calls[i], outcome)
        else:
            earlier.append(outcome)
    return folded, earlier
