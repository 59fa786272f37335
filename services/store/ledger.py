"""Repositories of the ledger's read side: records (with the one row→record mapping) and thread heads.

All SQL lives in ``services.store``, one module per table group: this one the records' and heads',
``batches`` the recorder's reads and writes of a batch (records, calls, sessions, runs, state,
receipts), ``tracking`` partition positions and dead letters, ``views`` the compaction state's,
``queries`` the request reads', ``search`` the index's; ``postgres`` and ``memory`` expose them as
the ports.

Every method that takes part in a caller's transaction takes the connection first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, cast

import asyncpg

from contracts.inspect import InspectedRecord


from services.core.hashing import ChainLink
from services.core.records import LedgerRecord
from services.core.ledger import deferred_tokens

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

# A plain connection or one borrowed from a pool: repositories accept either.
Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
# A row as asyncpg reads it, or as the in-memory store holds it: read by column name alike.
Row: TypeAlias = "asyncpg.Record | Mapping[str, Any]"

__all__ = [
    "Conn",
    "EventOutcome",
    "EvidenceRow",
    "FullRecord",
    "HEAD_COLUMNS",
    "LedgerRecord",
    "RECORD_BLOB_JOIN",
    "RECORD_ROW",
    "Row",
    "StoredHead",
    "blob_preview",
    "evidence_of_row",
    "event_outcome_of",
    "find_event_outcome",
    "head_of_row",
    "ledger_record_of_row",
    "open_call_ids",
    "select_evidence",
    "select_full",
    "select_head",
    "select_inherited",
    "select_links",
    "select_records",
    "select_refs",
    "select_tail",
    "totals",
]

# ``(seq, event_key, kind, payload, full text, client_ts)`` of a record, for replaying a thread's state.
FullRecord: TypeAlias = tuple[int, str, str, dict[str, object], str, str | None]

# What head_of_row reads, of ``ctx.thread_heads h`` (also read with a view: thread_at_head.py).
HEAD_COLUMNS = """h.thread_id, h.session_id, h.run_id, h.instance_id, h.revision, h.last_seq, h.last_hash,
       h.last_event_key, h.user_turns, h.model_steps"""
_SELECT_HEAD = f"SELECT {HEAD_COLUMNS} FROM ctx.thread_heads h WHERE h.thread_id = $1"


# What a LedgerRecord is read from (``_ledger_record``), written once for every query that reads one:
# named columns of ``ctx.records r`` (with ``ctx.blobs b`` joined for a large text), or one ROW of
# them in this order (``RECORD_ROW``, read back by ``ledger_record_of_row``).
_RECORD_FIELDS: tuple[tuple[str, str], ...] = (
    ("thread_id", "r.thread_id"),
    ("seq", "r.seq"),
    ("session_seq", "r.session_seq"),
    ("event_key", "r.event_key"),
    ("kind", "r.kind"),
    ("payload", "r.payload"),
    ("text", "COALESCE(r.view_text, r.text, convert_from(b.content, 'UTF8'))"),
    ("tokens_o200k", "r.tokens_o200k"),
    ("tokens_cl100k", "r.tokens_cl100k"),
    ("mask_text", "r.mask_text"),
    ("mask_tokens_o200k", "r.mask_tokens_o200k"),
    ("mask_tokens_cl100k", "r.mask_tokens_cl100k"),
    ("recorded_at", "r.recorded_at"),
)
_RECORD_COLUMNS = (
    "\nSELECT "
    + ", ".join(e if e == f"r.{n}" else f"{e} AS {n}" for n, e in _RECORD_FIELDS)
    + "\nFROM ctx.records r\n"
)
RECORD_ROW = "ROW(" + ", ".join(e for _, e in _RECORD_FIELDS) + ")"
# The blob a record's text is stored in, when it is neither inline nor a view text.
RECORD_BLOB_JOIN = (
    "LEFT JOIN ctx.blobs b ON r.text IS NULL AND r.view_text IS NULL AND b.sha256 = r.blob_sha256"
)


_SELECT_RECORDS = (
    _RECORD_COLUMNS
    + RECORD_BLOB_JOIN
    + """
WHERE r.thread_id = $1 AND r.seq > $2 AND r.seq <= $3
ORDER BY r.seq
"""
)


_SELECT_INHERITED = (
    _RECORD_COLUMNS
    + """JOIN ctx.thread_heads h ON h.thread_id = r.thread_id AND h.role = 'main'
"""
    + RECORD_BLOB_JOIN
    + """
WHERE r.session_id = $1 AND r.session_seq > $2 AND r.session_seq <= $3 AND r.thread_id <> $4
ORDER BY r.session_seq
"""
)


_SELECT_BY_REF = (
    _RECORD_COLUMNS
    + """JOIN unnest($1::text[], $2::bigint[]) AS k(thread_id, seq) ON r.thread_id = k.thread_id
         AND r.seq = k.seq
"""
    + RECORD_BLOB_JOIN
    + """
ORDER BY r.session_seq
"""
)


# Recorded (with its content hash), or else its newest dead letter — filed under the thread, or naming
# it from another thread's subject: one round trip for a prepare waiting on its event.
_FIND_EVENT_OUTCOME = """
SELECT
  (SELECT json_build_array(r.seq, r.content_sha256) FROM ctx.records r
   JOIN ctx.sessions s ON s.session_id = r.session_id
   WHERE r.thread_id = $1 AND r.event_key = $2 AND s.tenant = $3) AS recorded,
  (SELECT json_build_array(d.code, d.reason) FROM ctx.dead_letters d
   WHERE (d.thread_id = $1 OR d.named_thread_id = $1) AND d.event_key = $2 AND d.tenant = $3
   ORDER BY d.id DESC LIMIT 1) AS dead
"""


_SELECT_LINKS = """
SELECT seq, content_sha256, prev_hash, record_hash FROM ctx.records WHERE thread_id = $1 ORDER BY seq
"""


# A message of tool calls only has no text: its preview names the calls instead of showing nothing.
_SELECT_TAIL = """
SELECT seq, session_seq, kind, event_key, tokens_o200k, content_sha256, record_hash, blob_sha256,
       left(COALESCE(
           NULLIF(COALESCE(view_text, text, ''), ''),
           (SELECT 'calls: ' || string_agg(e.c->>'name', ', ' ORDER BY e.n)
            FROM json_array_elements(CASE WHEN json_typeof(payload->'tool_calls') = 'array'
                                          THEN payload->'tool_calls' ELSE '[]'::json END)
                 WITH ORDINALITY AS e(c, n)),
           ''), $3) AS preview,
       -- Content stored only as a blob (a long output kept whole) previews from the blob's head; in
       -- bytes, four per character at most, decoded in Python where a cut character is dropped.
       CASE WHEN text IS NULL AND view_text IS NULL THEN
           (SELECT substring(b.content FROM 1 FOR $3 * 4) FROM ctx.blobs b WHERE b.sha256 = blob_sha256)
       END AS blob_head,
       ARRAY(SELECT e.c->>'name'
             FROM json_array_elements(CASE WHEN json_typeof(payload->'tool_calls') = 'array'
                                           THEN payload->'tool_calls' ELSE '[]'::json END)
                  WITH ORDINALITY AS e(c, n) ORDER BY e.n) AS call_names,
       CASE WHEN kind = 'tool_outcome' THEN
           (SELECT c.name FROM ctx.tool_calls c WHERE c.thread_id = $1 AND c.call_id = payload->>'call_id')
       END AS outcome_tool,
       CASE WHEN kind = 'tool_outcome' THEN payload->>'status' END AS status
FROM ctx.records WHERE thread_id = $1 ORDER BY seq DESC LIMIT $2
"""


_THREAD_TOTALS = """
SELECT count(*) AS n, COALESCE(sum(tokens_o200k), 0) AS tokens FROM ctx.records WHERE thread_id = $1
"""


_OPEN_CALLS = """
SELECT call_id FROM ctx.tool_calls WHERE thread_id = $1 AND outcome_seq IS NULL ORDER BY call_seq, call_id
"""


_SELECT_EVIDENCE = """
SELECT r.thread_id, r.seq, r.event_key, r.kind, r.content_sha256, r.record_hash, r.text, r.blob_sha256,
       b.content AS blob
FROM ctx.records r
JOIN unnest($2::text[], $3::bigint[]) AS k(thread_id, seq) ON r.thread_id = k.thread_id AND r.seq = k.seq
LEFT JOIN ctx.blobs b ON r.text IS NULL AND b.sha256 = r.blob_sha256
WHERE r.session_id = $1
"""


_SELECT_FULL = """
SELECT r.seq, r.event_key, r.kind, r.payload,
       COALESCE(r.text, convert_from(b.content, 'UTF8')) AS text, r.client_ts
FROM ctx.records r LEFT JOIN ctx.blobs b ON r.text IS NULL AND b.sha256 = r.blob_sha256
WHERE r.thread_id = $1 ORDER BY r.seq
"""


@dataclass(frozen=True, slots=True)
class EvidenceRow:
    """A record asked for as evidence: its identity and its text, inline or as stored blob bytes."""

    event_key: str
    kind: str
    content_sha256: str
    record_hash: str
    text: str | None
    blob_sha256: str | None
    blob: bytes | None


class EventOutcome(NamedTuple):
    """What became of an event key in a thread: recorded at ``seq`` with ``content_sha256``, or refused
    (``rejected``: its newest dead letter's code and reason), or neither yet (all ``None``)."""

    seq: int | None
    content_sha256: str | None
    rejected: tuple[str, str] | None


@dataclass(frozen=True, slots=True)
class StoredHead:
    """A thread head as stored."""

    thread_id: str
    session_id: str
    run_id: str
    instance_id: str
    revision: int
    last_seq: int
    last_hash: str
    last_event_key: str | None
    user_turns: int = 0
    model_steps: int = 0


def blob_preview(head: bytes | None, chars: int) -> str:
    """The preview of content stored only as a blob, from its first bytes (a character they cut is
    dropped: the preview is a glimpse, the blob stays whole)."""
    return "" if head is None else head.decode("utf-8", "ignore")[:chars]


def ledger_record_of_row(values: Sequence[object]) -> LedgerRecord:
    """A record from one ``RECORD_ROW`` (an anonymous row asyncpg reads as a tuple)."""
    return _ledger_record(cast(Any, dict(zip((n for n, _ in _RECORD_FIELDS), values, strict=True))))


def _ledger_record(r: asyncpg.Record) -> LedgerRecord:
    payload = json.loads(r["payload"])
    text = r["text"] or ""
    mask_text = r["mask_text"]
    return LedgerRecord(
        seq=r["session_seq"],
        event_key=r["event_key"],
        kind=r["kind"],
        payload=payload,
        text=text,
        # NULL cl100k: the recorder deferred it; counted here on first use.
        tokens=deferred_tokens(r["kind"], payload, text, r["tokens_o200k"], r["tokens_cl100k"]),
        mask_text=mask_text,
        mask_tokens=(
            deferred_tokens(r["kind"], payload, mask_text, r["mask_tokens_o200k"], r["mask_tokens_cl100k"])
            if mask_text is not None
            else None
        ),
        thread_id=r["thread_id"],
        thread_seq=r["seq"],
        recorded_at=r["recorded_at"],
    )


def evidence_of_row(r: Row) -> EvidenceRow:
    """A record's evidence from a row of its text, or its blob's bytes."""
    return EvidenceRow(
        r["event_key"],
        r["kind"],
        r["content_sha256"],
        r["record_hash"],
        r["text"],
        r["blob_sha256"],
        None if r["blob"] is None else bytes(r["blob"]),
    )


def head_of_row(r: Row) -> StoredHead:
    """A head from a row with ``HEAD_COLUMNS``."""
    return StoredHead(
        r["thread_id"],
        r["session_id"],
        r["run_id"],
        r["instance_id"],
        r["revision"],
        r["last_seq"],
        r["last_hash"],
        r["last_event_key"],
        r["user_turns"],
        r["model_steps"],
    )


async def select_head(conn: Conn, thread_id: str) -> StoredHead | None:
    """The head of a thread, or ``None`` if nothing was recorded for it."""
    r = await conn.fetchrow(_SELECT_HEAD, thread_id)
    return None if r is None else head_of_row(r)


async def open_call_ids(conn: Conn, thread_id: str) -> list[str]:
    """Calls of the thread still waiting for an outcome."""
    return [r["call_id"] for r in await conn.fetch(_OPEN_CALLS, thread_id)]


async def select_records(conn: Conn, thread_id: str, *, gt: int, lte: int) -> list[LedgerRecord]:
    """Records of a thread with ``gt < seq <= lte``, in order; ``seq`` is their session seq."""
    return [_ledger_record(r) for r in await conn.fetch(_SELECT_RECORDS, thread_id, gt, lte)]


async def select_inherited(
    conn: Conn, session_id: str, *, after: int, through: int, exclude_thread: str
) -> list[LedgerRecord]:
    """Records of the session's main threads with ``after < session_seq <= through`` (a snapshot)."""
    return [
        _ledger_record(r)
        for r in await conn.fetch(_SELECT_INHERITED, session_id, after, through, exclude_thread)
    ]


async def select_refs(conn: Conn, refs: Sequence[tuple[str, int]]) -> list[LedgerRecord]:
    """The records named by ``(thread_id, thread seq)`` pairs, in session order."""
    if not refs:
        return []
    return [
        _ledger_record(r)
        for r in await conn.fetch(_SELECT_BY_REF, [t for t, _ in refs], [q for _, q in refs])
    ]


async def find_event_outcome(conn: Conn, tenant: str, thread_id: str, event_key: str) -> EventOutcome:
    """Where an event key was recorded in a thread of ``tenant``, with its content hash; else its
    newest dead letter's code and reason, if it was rejected (all ``None``: not seen yet)."""
    row = await conn.fetchrow(_FIND_EVENT_OUTCOME, thread_id, event_key, tenant)
    assert row is not None  # a SELECT of scalar subqueries always returns its one row
    return event_outcome_of(row["recorded"], row["dead"])


def event_outcome_of(recorded: str | None, dead: str | None) -> EventOutcome:
    """An outcome from the JSON arrays ``[seq, content_sha256]`` and ``[code, reason]`` (or ``NULL``s)."""
    if recorded is not None:
        seq, content_sha256 = json.loads(recorded)
        return EventOutcome(int(seq), str(content_sha256), None)
    if dead is None:
        return EventOutcome(None, None, None)
    code, reason = json.loads(dead)
    return EventOutcome(None, None, (str(code), str(reason)))


async def select_full(conn: Conn, thread_id: str) -> list[FullRecord]:
    """Every record of a thread with its full text, for replaying its state."""
    return [
        (
            r["seq"],
            r["event_key"],
            r["kind"],
            json.loads(r["payload"]),
            r["text"] or "",
            r["client_ts"].isoformat() if r["client_ts"] else None,
        )
        for r in await conn.fetch(_SELECT_FULL, thread_id)
    ]


async def select_links(conn: Conn, thread_id: str) -> list[ChainLink]:
    """The hash chain of a thread, in order."""
    return [
        ChainLink(r["seq"], r["content_sha256"], r["prev_hash"], r["record_hash"])
        for r in await conn.fetch(_SELECT_LINKS, thread_id)
    ]


async def select_tail(conn: Conn, thread_id: str, *, limit: int, preview_chars: int) -> list[InspectedRecord]:
    """The last ``limit`` records of a thread, newest first, with a short preview (their ``window``
    is the caller's to place: the store keeps where windows opened, not which a record is in)."""
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
            preview=r["preview"] or blob_preview(r["blob_head"], preview_chars),
            tools=tuple(r["call_names"]) or ((r["outcome_tool"],) if r["outcome_tool"] else ()),
            status=r["status"],
        )
        for r in await conn.fetch(_SELECT_TAIL, thread_id, limit, preview_chars)
    ]


async def select_evidence(
    conn: Conn, session_id: str, refs: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], EvidenceRow]:
    """The records named by ``(thread_id, thread seq)`` that belong to ``session_id``, with their
    inline text or their blob's bytes (unverified: the caller checks them against ``blob_sha256``)."""
    rows = await conn.fetch(_SELECT_EVIDENCE, session_id, [t for t, _ in refs], [q for _, q in refs])
    return {(r["thread_id"], r["seq"]): evidence_of_row(r) for r in rows}


async def totals(conn: Conn, thread_id: str) -> tuple[int, int]:
    """``(record count, o200k tokens)`` of a thread."""
    r = await conn.fetchrow(_THREAD_TOTALS, thread_id)
    return (0, 0) if r is None else (int(r["n"]), int(r["tokens"]))
