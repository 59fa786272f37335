"""What every view load starts from, read at one instant in one round trip.

A view load read the thread's head, its scope (session, run, reset fence), its compaction state
(with the summary) and its open window in four statements; on the read-your-writes path each round
trip is one more wake-up of PostgreSQL and of the fleet. One statement reads them together, from one
snapshot — a head and a view state that no commit can fall between — and, like ``load_view``,
without the body of a summary this store already holds. The thread's current facts come with it
unless the caller holds them for this head revision already (every recorded event moves the
revision, so they were two more statements on every read-your-writes step), and so do the thread's
records after the ones the caller holds (``records_after``): on a read-your-writes step the record
just committed came in a statement of its own. A prepare naming an event asks what became of it in the
same statement (``event_key``): recorded in this thread (with its content hash), or dead-lettered.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.core.state import StateView
from services.store.batches import FACTS_JSON, VERSIONS_JSON, states_from_json
from services.core.records import LedgerRecord
from services.store.ledger import (
    HEAD_COLUMNS,
    EventOutcome,
    RECORD_BLOB_JOIN,
    RECORD_ROW,
    Conn,
    StoredHead,
    event_outcome_of,
    head_of_row,
    ledger_record_of_row,
)
from services.store.views import (
    SCOPE_COLUMNS,
    VIEW_COLUMNS,
    SummaryRows,
    ThreadScope,
    ViewState,
    held_summary_id,
    scope_of_row,
    view_state_of_row,
)
from services.store.windows import OpenWindow, open_window_of

__all__ = ["ThreadAtHead", "read_thread_at_head"]

# The row readers' own columns (a thread without a view row reads its view columns as NULL: an
# empty state), the newest window, the facts unless the caller holds them for this revision ($3), and
# the records after seq $4 up to the head (NULL: none asked for), and what became of event key $5 in
# this thread (NULL: none named) — as ``find_event_outcome`` answers, for the thread's own tenant.
_THREAD_AT_HEAD = f"""
SELECT {HEAD_COLUMNS},
       {SCOPE_COLUMNS},
       v.thread_id IS NOT NULL AS has_view,
       {VIEW_COLUMNS},
       w.window_no, w.opened_after, w.body AS window_body,
       h.revision IS DISTINCT FROM $3::bigint AS facts_read,
       CASE WHEN h.revision IS DISTINCT FROM $3::bigint THEN
         (SELECT json_agg({FACTS_JSON}) FROM ctx.state_facts WHERE thread_id = h.thread_id AND is_current)
       END AS facts,
       CASE WHEN h.revision IS DISTINCT FROM $3::bigint THEN
         (SELECT json_agg({VERSIONS_JSON}) FROM ctx.state_versions WHERE thread_id = h.thread_id)
       END AS versions,
       CASE WHEN h.last_seq > $4::bigint THEN
         ARRAY(SELECT {RECORD_ROW} FROM ctx.records r {RECORD_BLOB_JOIN}
               WHERE r.thread_id = h.thread_id AND r.seq > $4::bigint AND r.seq <= h.last_seq ORDER BY r.seq)
       END AS records,
       CASE WHEN $5::text IS NOT NULL THEN
         (SELECT json_build_array(n.seq, n.content_sha256) FROM ctx.records n
          WHERE n.thread_id = h.thread_id AND n.event_key = $5::text)
       END AS named_recorded,
       CASE WHEN $5::text IS NOT NULL THEN
         (SELECT json_build_array(d.code, d.reason) FROM ctx.dead_letters d
          WHERE (d.thread_id = h.thread_id OR d.named_thread_id = h.thread_id) AND d.event_key = $5::text
            AND d.tenant = s.tenant
          ORDER BY d.id DESC LIMIT 1)
       END AS named_dead
FROM ctx.thread_heads h
JOIN ctx.sessions s ON s.session_id = h.session_id
LEFT JOIN ctx.runs r ON r.run_id = h.run_id
LEFT JOIN ctx.thread_views v ON v.thread_id = h.thread_id
LEFT JOIN ctx.summaries sm ON sm.summary_id = v.summary_id
LEFT JOIN LATERAL (
  SELECT cw.window_no, cw.opened_after, hd.body::text AS body
  FROM ctx.windows cw JOIN ctx.window_handoffs hd USING (handoff_id)
  WHERE cw.thread_id = h.thread_id ORDER BY cw.window_no DESC LIMIT 1
) w ON true
WHERE h.thread_id = $1
"""


@dataclass(frozen=True, slots=True)
class ThreadAtHead:
    """A thread's head with its scope, compaction state and open window, as of one instant."""

    head: StoredHead
    scope: ThreadScope
    state: ViewState
    window: OpenWindow | None
    # The current facts (``None``: the thread has none), unless the caller held them for this revision.
    facts: StateView | None = None
    facts_read: bool = False
    # The records after ``records_after`` up to the head, in order; ``None``: not asked for.
    records: list[LedgerRecord] | None = None
    # What became of the event key asked about; ``None``: none was.
    named: EventOutcome | None = None


async def read_thread_at_head(
    conn: Conn,
    thread_id: str,
    summaries: SummaryRows | None = None,
    *,
    facts_of_revision: int | None = None,
    records_after: int | None = None,
    event_key: str | None = None,
) -> ThreadAtHead | None:
    """The thread at its head, or ``None`` if nothing was recorded for it; its facts too unless the
    head is still at ``facts_of_revision``, its records after seq ``records_after`` if given, and what
    became of ``event_key`` if given."""
    held = summaries.held(thread_id) if summaries is not None else None
    r = await conn.fetchrow(
        _THREAD_AT_HEAD, thread_id, held_summary_id(held), facts_of_revision, records_after, event_key
    )
    if r is None:
        return None
    state = view_state_of_row(thread_id, r, held, summaries) if r["has_view"] else ViewState()
    window = (
        None
        if r["window_no"] is None
        else open_window_of(r["window_no"], r["opened_after"], r["window_body"])
    )
    facts = states_from_json(r["facts"], r["versions"]).get(thread_id) if r["facts_read"] else None
    records: list[LedgerRecord] | None = None
    if records_after is not None:
        records = [ledger_record_of_row(row) for row in r["records"] or ()]
    named = None if event_key is None else event_outcome_of(r["named_recorded"], r["named_dead"])
    return ThreadAtHead(
        head_of_row(r), scope_of_row(r), state, window, facts, bool(r["facts_read"]), records, named
    )
