"""The indexer's service: chunk and index each thread's records after its last indexed position.

Idempotent and gap-free by construction: a thread's chunks and its new position commit in one
transaction, chunks are keyed by (thread, seq, chunk), and a thread is read from its position on —
a stopped indexer catches up from where it was, never twice, never skipping.
"""

from __future__ import annotations

import asyncio

import asyncpg

from .store._errors import translate_pg_errors

__all__ = ["INDEX_VERSION", "chunk_text", "index_thread", "reindex", "stale_threads"]

# Bump when chunking or the text configuration changes: reindexing migrates the index.
INDEX_VERSION = 1
_CHUNK_BYTES = 4096

_POSITION = "SELECT last_seq, index_version FROM ctx.index_positions WHERE thread_id = $1 FOR UPDATE"
_DROP_THREAD = "DELETE FROM ctx.search_chunks WHERE thread_id = $1"
_RECORDS = """
SELECT r.seq, r.session_id, r.kind, r.event_key, r.recorded_at, COALESCE(r.text, convert_from(b.content, 'UTF8')) AS text, r.payload
FROM ctx.records r LEFT JOIN ctx.blobs b ON r.text IS NULL AND b.sha256 = r.blob_sha256
WHERE r.thread_id = $1 AND r.seq > $2 ORDER BY r.seq LIMIT $3
"""
_INSERT = """
INSERT INTO ctx.search_chunks (thread_id, seq, chunk, session_id, kind, event_key, start_byte, end_byte,
                               start_line, end_line, recorded_at, text, tsv)
SELECT t, s, c, sess, k, e, sb, eb, sl, el, ts, x, to_tsvector('simple', x)
FROM unnest($1::text[], $2::bigint[], $3::int[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
            $9::int[], $10::int[], $11::timestamptz[], $12::text[]) AS u(t, s, c, sess, k, e, sb, eb, sl, el, ts, x)
ON CONFLICT (thread_id, seq, chunk) DO NOTHING
"""
_SET_POSITION = """
INSERT INTO ctx.index_positions (thread_id, last_seq, index_version) VALUES ($1, $2, $3)
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


def chunk_text(text: str) -> list[tuple[int, int, int, int, str]]:
    """``(start_byte, end_byte, start_line, end_line, text)`` chunks of whole lines, ~4 KiB each."""
    chunks: list[tuple[int, int, int, int, str]] = []
    lines = text.splitlines(keepends=True) or [""]
    start_byte = byte = 0
    start_line = line_no = 1
    current: list[str] = []
    size = 0
    for line in lines:
        n = len(line.encode("utf-8"))
        if current and size + n > _CHUNK_BYTES:
            chunks.append((start_byte, byte, start_line, line_no - 1, "".join(current)))
            current, size, start_byte, start_line = [], 0, byte, line_no
        current.append(line)
        size += n
        byte += n
        line_no += 1
    chunks.append((start_byte, byte, start_line, max(start_line, line_no - 1), "".join(current)))
    return chunks


def _searchable(kind: str, text: str, payload: str) -> str:
    # Tool calls live in the payload (names and arguments); outcomes and messages in the text.
    return f"{text}\n{payload}" if kind in ("assistant_message", "state_patch", "resource_activated", "child_result") else text


async def index_thread(pool: asyncpg.Pool, thread_id: str, *, batch: int = 500) -> int:
    """Index every record of ``thread_id`` after its position; returns how many were indexed."""
    total = 0
    while True:
        async with pool.acquire() as conn:
            with translate_pg_errors(thread_id):
                async with conn.transaction():
                    row = await conn.fetchrow(_POSITION, thread_id)
                    position = 0 if row is None else int(row["last_seq"])
                    if row is not None and row["index_version"] != INDEX_VERSION:
                        # Indexed under another chunking or text configuration: migrate by reindexing.
                        await conn.execute(_DROP_THREAD, thread_id)
                        position = 0
                    rows = await conn.fetch(_RECORDS, thread_id, position, batch)
                    if not rows:
                        return total
                    cols: list[list[object]] = [[] for _ in range(12)]
                    for r in rows:
                        for i, (sb, eb, sl, el, text) in enumerate(chunk_text(_searchable(r["kind"], r["text"] or "", r["payload"]))):
                            for col, value in zip(cols, (thread_id, r["seq"], i, r["session_id"], r["kind"], r["event_key"], sb, eb, sl, el, r["recorded_at"], text), strict=True):
                                col.append(value)
                    await conn.execute(_INSERT, *cols)
                    await conn.execute(_SET_POSITION, thread_id, rows[-1]["seq"], INDEX_VERSION)
        total += len(rows)


async def stale_threads(pool: asyncpg.Pool, limit: int = 500) -> list[str]:
    """Threads recorded past their index position (or indexed under an older index version)."""
    async with pool.acquire() as conn:
        return [r["thread_id"] for r in await conn.fetch(_STALE, limit, INDEX_VERSION)]


async def reindex(pool: asyncpg.Pool, session_id: str | None = None) -> int:
    """Drop and rebuild the index of one session (or of everything) from the ledger."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            if session_id is None:
                await conn.execute("TRUNCATE ctx.search_chunks, ctx.index_positions")
                threads = [r["thread_id"] for r in await conn.fetch("SELECT thread_id FROM ctx.thread_heads")]
            else:
                threads = [r["thread_id"] for r in await conn.fetch("SELECT thread_id FROM ctx.thread_heads WHERE session_id = $1", session_id)]
                await conn.execute("DELETE FROM ctx.search_chunks WHERE session_id = $1", session_id)
                await conn.execute("DELETE FROM ctx.index_positions WHERE thread_id = ANY($1::text[])", threads)
    # A few threads at once: each is its own transaction, and the pool bounds the fan-out anyway.
    gate = asyncio.Semaphore(4)

    async def one(thread_id: str) -> int:
        async with gate:
            return await index_thread(pool, thread_id)

    return sum(await asyncio.gather(*(one(t) for t in threads)))
