"""The search index: chunks per thread record, index positions, and the ranked query. Only SQL here."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from contracts import SearchHit, SearchRequest

from contracts.exceptions import StoreRejected
from services.store._errors import translate_pg_errors
from services.store.ledger import Conn

__all__ = [
    "TSVECTOR_MAX_BYTES",
    "ChunkRow",
    "Chunker",
    "IndexStep",
    "SkippedRecord",
    "chunk_rows",
    "index_next",
    "reset_index",
    "search_session",
    "stale_index_threads",
]

# ``(kind, text, payload)`` of a record → its ``(start_byte, end_byte, start_line, end_line, text)`` chunks.
Chunker = Callable[[str, str, str], Sequence[tuple[int, int, int, int, str]]]


# thread, seq, chunk number, session, kind, event key, start/end byte, start/end line, recorded at, text.
ChunkRow = tuple[str, int, int, str, str, str, int, int, int, int, Any, str]

# PostgreSQL's bound on a tsvector's lexemes and positions (MAXSTRPOS): over it, to_tsvector fails
# with "string is too long for tsvector" (SQLSTATE 54000).
TSVECTOR_MAX_BYTES = 1_048_575


@dataclass(frozen=True, slots=True)
class SkippedRecord:
    """A record of a thread that the store refused to index, and why; the position moved past it."""

    seq: int
    sqlstate: str
    reason: str


@dataclass(frozen=True, slots=True)
class IndexStep:
    """One step of indexing a thread: the records the position moved past, and those skipped among them."""

    records: int
    skipped: tuple[SkippedRecord, ...] = ()


def chunk_rows(thread_id: str, record: Any, text: str, chunker: Chunker) -> Iterator[ChunkRow]:
    """The chunk rows of one record (a row naming seq, session_id, kind, event_key, payload and
    recorded_at), columns in the order of ``ctx.search_chunks``: thread, seq, chunk number, session,
    kind, event key, byte and line span, recorded at, chunk text. The store and its twin share it."""
    for i, (sb, eb, sl, el, chunk) in enumerate(chunker(record["kind"], text, record["payload"])):
        yield (
            thread_id,
            record["seq"],
            i,
            record["session_id"],
            record["kind"],
            record["event_key"],
            sb,
            eb,
            sl,
            el,
            record["recorded_at"],
            chunk,
        )


_SESSION = "SELECT principal_id FROM ctx.sessions WHERE session_id = $1 AND tenant = $2"
# Visibility is the WHERE clause: only this session's chunks, whatever scope the request names.
# Ranking reads every candidate's tsvector, so a common word over a huge session is ranked among
# its most recent matches only (_CANDIDATES); rare identifiers and error codes are unaffected.
_CANDIDATES = 2000
_SEARCH = """
WITH q AS (SELECT plainto_tsquery('simple', $2) AS query),
m AS (
  SELECT c.* FROM ctx.search_chunks c, q, ctx.thread_heads h
  WHERE c.session_id = $1 AND c.tsv @@ q.query AND h.thread_id = c.thread_id
    AND ($3::text IS NULL OR h.run_id = $3)
    AND ($4::text IS NULL OR c.thread_id = $4)
    AND (cardinality($5::text[]) = 0 OR c.kind = ANY($5))
    AND ($7::timestamptz IS NULL OR c.recorded_at >= $7)
    AND ($8::timestamptz IS NULL OR c.recorded_at < $8)
  ORDER BY c.recorded_at DESC, c.seq DESC
  LIMIT $9
)
SELECT m.thread_id, m.seq, m.kind, m.event_key, m.recorded_at,
       m.start_byte, m.end_byte, m.start_line, m.end_line,
       ts_rank(m.tsv, q.query) AS rank,
       ts_headline('simple', m.text, q.query,
                   'MaxFragments=1, MaxWords=24, MinWords=8, StartSel=«, StopSel=»') AS snippet,
       EXISTS (SELECT 1 FROM ctx.state_facts f
               WHERE f.thread_id = m.thread_id AND f.seq = m.seq AND NOT f.is_current)
         AS superseded
FROM m, q
ORDER BY rank DESC, m.seq DESC, m.thread_id, m.chunk
LIMIT $6
"""
_POSITION = "SELECT last_seq, index_version FROM ctx.index_positions WHERE thread_id = $1 FOR UPDATE"
_DROP_THREAD = "DELETE FROM ctx.search_chunks WHERE thread_id = $1"
_RECORDS = """
SELECT r.seq, r.session_id, r.kind, r.event_key, r.recorded_at,
       COALESCE(r.text, convert_from(b.content, 'UTF8')) AS text, r.payload
FROM ctx.records r LEFT JOIN ctx.blobs b ON r.text IS NULL AND b.sha256 = r.blob_sha256
WHERE r.thread_id = $1 AND r.seq > $2 ORDER BY r.seq LIMIT $3
"""
# One row per record after the position (at most $2), or one row of NULLs past the position when none.
_POSITION_AND_RECORDS = """
SELECT p.last_seq, p.index_version, r.seq, r.session_id, r.kind, r.event_key, r.recorded_at, r.text, r.payload
FROM (SELECT $1::text AS thread_id) t
LEFT JOIN ctx.index_positions p USING (thread_id)
LEFT JOIN LATERAL (
  SELECT r.seq, r.session_id, r.kind, r.event_key, r.recorded_at,
         COALESCE(r.text, convert_from(b.content, 'UTF8')) AS text, r.payload
  FROM ctx.records r LEFT JOIN ctx.blobs b ON r.text IS NULL AND b.sha256 = r.blob_sha256
  WHERE r.thread_id = $1 AND r.seq > COALESCE(p.last_seq, 0)
  ORDER BY r.seq LIMIT $2
) r ON true
ORDER BY r.seq
"""
_STORE_CHUNKS = """
WITH chunks AS (
INSERT INTO ctx.search_chunks (thread_id, seq, chunk, session_id, kind, event_key, start_byte, end_byte,
                               start_line, end_line, recorded_at, text, tsv)
SELECT t, s, c, sess, k, e, sb, eb, sl, el, ts, x, to_tsvector('simple', x)
FROM unnest($1::text[], $2::bigint[], $3::int[], $4::text[], $5::text[], $6::text[],
            $7::bigint[], $8::bigint[], $9::int[], $10::int[], $11::timestamptz[], $12::text[])
     AS u(t, s, c, sess, k, e, sb, eb, sl, el, ts, x)
ON CONFLICT (thread_id, seq, chunk) DO NOTHING
)
INSERT INTO ctx.index_positions (thread_id, last_seq, index_version) VALUES ($15::text, $13, $14)
ON CONFLICT (thread_id) DO UPDATE SET
    last_seq = CASE WHEN ctx.index_positions.index_version = EXCLUDED.index_version
                    THEN GREATEST(ctx.index_positions.last_seq, EXCLUDED.last_seq) ELSE EXCLUDED.last_seq END,
    index_version = EXCLUDED.index_version
"""
_STALE = """
SELECT h.thread_id FROM ctx.thread_heads h LEFT JOIN ctx.index_positions p USING (thread_id)
WHERE h.last_seq > COALESCE(p.last_seq, 0) OR p.index_version IS DISTINCT FROM $2
LIMIT $1
"""
_TRUNCATE = "TRUNCATE ctx.search_chunks, ctx.index_positions"
_ALL_THREADS = "SELECT thread_id FROM ctx.thread_heads"
_SESSION_THREADS = "SELECT thread_id FROM ctx.thread_heads WHERE session_id = $1"
_DROP_SESSION = "DELETE FROM ctx.search_chunks WHERE session_id = $1"
_DROP_POSITIONS = "DELETE FROM ctx.index_positions WHERE thread_id = ANY($1::text[])"


async def search_session(conn: Conn, tenant: str, request: SearchRequest) -> tuple[SearchHit, ...] | None:
    """The best hits of the query in the request's session of ``tenant``; ``None`` if the asking
    principal may not see the session (or it is not ``tenant``'s)."""
    session = await conn.fetchrow(_SESSION, request.session_id, tenant)
    if session is None or (
        session["principal_id"] is not None and session["principal_id"] != request.principal_id
    ):
        return None
    rows = await conn.fetch(
        _SEARCH,
        request.session_id,
        request.query,
        request.run_id,
        request.thread_id,
        list(request.kinds),
        request.limit,
        request.since,
        request.until,
        _CANDIDATES,
    )
    return tuple(SearchHit(**dict(r)) for r in rows)


async def index_next(conn: Conn, thread_id: str, *, batch: int, version: int, chunker: Chunker) -> IndexStep:
    """Index up to ``batch`` records of the thread after its position.

    Two statements, no transaction around them (not six round trips per pass): one reads
    the position with the records after it, one stores their chunks with the new position. Two
    passes over the same records at once store the same chunks (``ON CONFLICT DO NOTHING``) and the
    greater position, so nothing is locked; a thread indexed under another version is reindexed
    from the start in one transaction (``_reindex_next``).
    """
    rows = await conn.fetch(_POSITION_AND_RECORDS, thread_id, batch)
    if rows[0]["index_version"] is not None and rows[0]["index_version"] != version:
        return await _reindex_next(conn, thread_id, batch=batch, version=version, chunker=chunker)
    if rows[0]["seq"] is None:
        return IndexStep(0)  # nothing after the position
    return IndexStep(len(rows), await _store_chunks(conn, thread_id, rows, chunker, version))


async def _reindex_next(
    conn: Conn, thread_id: str, *, batch: int, version: int, chunker: Chunker
) -> IndexStep:
    """Indexed under another chunking or text configuration: drop the thread's chunks, index from 0."""
    async with conn.transaction():
        row = await conn.fetchrow(_POSITION, thread_id)
        position = 0 if row is None else int(row["last_seq"])
        if row is not None and row["index_version"] != version:
            await conn.execute(_DROP_THREAD, thread_id)
            position = 0
        rows = await conn.fetch(_RECORDS, thread_id, position, batch)
        if not rows:
            return IndexStep(0)
        skipped = await _store_chunks(conn, thread_id, rows, chunker, version)
    return IndexStep(len(rows), skipped)


async def _store_chunks(
    conn: Conn, thread_id: str, rows: Sequence[Any], chunker: Chunker, version: int
) -> tuple[SkippedRecord, ...]:
    """The chunks of the records ``rows`` hold (both reads name the same columns), and the position
    after the last of them, in one statement; the records the store refuses to index, skipped.

    A refused statement (a value PostgreSQL will refuse every time: a tsvector over its limit) is
    stored again a record at a time, each statement moving the position past its record, so one
    record at fault is skipped — and named — while the others are indexed.
    """
    chunks = [list(chunk_rows(thread_id, r, r["text"] or "", chunker)) for r in rows]
    try:
        await _insert_chunks(conn, thread_id, [c for cs in chunks for c in cs], rows[-1]["seq"], version)
        return ()
    except StoreRejected:
        pass
    skipped: list[SkippedRecord] = []
    for r, record_chunks in zip(rows, chunks, strict=True):
        try:
            await _insert_chunks(conn, thread_id, record_chunks, r["seq"], version)
        except StoreRejected as exc:
            skipped.append(SkippedRecord(r["seq"], str(exc.details.get("sqlstate", "")), exc.cause))
            await _insert_chunks(conn, thread_id, [], r["seq"], version)
    return tuple(skipped)


async def _insert_chunks(
    conn: Conn, thread_id: str, chunks: Sequence[ChunkRow], last_seq: int, version: int
) -> None:
    cols = [list(col) for col in zip(*chunks, strict=True)] if chunks else [[] for _ in range(12)]
    with translate_pg_errors(thread_id):
        if conn.is_in_transaction():
            # A savepoint: a refused statement leaves the reindex's transaction usable for the next.
            async with conn.transaction():
                await conn.execute(_STORE_CHUNKS, *cols, last_seq, version, thread_id)
        else:
            await conn.execute(_STORE_CHUNKS, *cols, last_seq, version, thread_id)


async def stale_index_threads(conn: Conn, limit: int, version: int) -> list[str]:
    """Threads recorded past their index position (or indexed under another index version)."""
    return [r["thread_id"] for r in await conn.fetch(_STALE, limit, version)]


async def reset_index(conn: Conn, session_id: str | None) -> list[str]:
    """Drop the index of one session (or of everything); the threads to index again."""
    async with conn.transaction():
        if session_id is None:
            await conn.execute(_TRUNCATE)
            return [r["thread_id"] for r in await conn.fetch(_ALL_THREADS)]
        threads = [r["thread_id"] for r in await conn.fetch(_SESSION_THREADS, session_id)]
        await conn.execute(_DROP_SESSION, session_id)
        await conn.execute(_DROP_POSITIONS, threads)
        return threads
