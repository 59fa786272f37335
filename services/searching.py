"""Search within what the asking principal's session recorded; hits are pointers, not evidence."""

from __future__ import annotations

import asyncpg

from contracts import SearchHit, SearchReply, SearchRequest

from .errors import ThreadNotFound
from .store._errors import translate_pg_errors

__all__ = ["search"]

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
SELECT m.thread_id, m.seq, m.kind, m.event_key, m.recorded_at, m.start_byte, m.end_byte, m.start_line, m.end_line,
       ts_rank(m.tsv, q.query) AS rank,
       ts_headline('simple', m.text, q.query, 'MaxFragments=1, MaxWords=24, MinWords=8, StartSel=«, StopSel=»') AS snippet,
       EXISTS (SELECT 1 FROM ctx.state_facts f WHERE f.thread_id = m.thread_id AND f.seq = m.seq AND NOT f.is_current)
         AS superseded
FROM m, q
ORDER BY rank DESC, m.seq DESC, m.thread_id, m.chunk
LIMIT $6
"""


async def search(pool: asyncpg.Pool, request: SearchRequest, *, tenant: str) -> SearchReply:
    """The best hits of the query in the request's session of ``tenant`` (nothing from any other session)."""
    async with pool.acquire() as conn:
        with translate_pg_errors():
            session = await conn.fetchrow(_SESSION, request.session_id, tenant)
            if session is None or (session["principal_id"] is not None and session["principal_id"] != request.principal_id):
                raise ThreadNotFound(f"session {request.session_id}")
            rows = await conn.fetch(
                _SEARCH, request.session_id, request.query, request.run_id, request.thread_id, list(request.kinds), request.limit,
                request.since, request.until, _CANDIDATES,
            )
    return SearchReply(hits=tuple(SearchHit(**dict(r)) for r in rows))
