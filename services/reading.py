"""Read-back of stored content: a verified byte or line range, only for the session that owns it."""

from __future__ import annotations

import asyncpg

from contracts import ReadReply, ReadRequest

from .errors import ContentNotFound, IntegrityError
from .hashing import sha256_hex
from .store._errors import translate_pg_errors

__all__ = ["read_range", "verified_blob"]

_SELECT_BLOB = """
SELECT b.content FROM ctx.blobs b
WHERE b.sha256 = $2
  AND EXISTS (SELECT 1 FROM ctx.records r WHERE r.blob_sha256 = $2 AND r.session_id = $1)
  AND EXISTS (SELECT 1 FROM ctx.sessions s WHERE s.session_id = $1 AND s.tenant = $4
              AND (s.principal_id IS NULL OR s.principal_id = $3))
"""


def verified_blob(content: bytes, sha: str) -> bytes:
    """``content`` if it still hashes to ``sha``; an integrity error, never lookalike content, otherwise."""
    actual = sha256_hex(content)
    if actual != sha:
        raise IntegrityError(f"ctx://blob/{sha}", actual)
    return content


async def read_range(pool: asyncpg.Pool, request: ReadRequest, *, tenant: str) -> ReadReply:
    """The requested range after re-reading the content and checking its sha256.

    Only content a session of ``tenant`` recorded: another tenant's looks exactly like missing content.
    """
    sha = request.ref.rsplit("/", 1)[1]
    async with pool.acquire() as conn:
        with translate_pg_errors():
            content = await conn.fetchval(_SELECT_BLOB, request.session_id, sha, request.principal_id, tenant)
    if content is None:
        raise ContentNotFound(request.ref)
    data = verified_blob(bytes(content), sha)
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    if request.line is not None and request.lines is not None:
        start = request.line - 1
        chunk = "".join(lines[start : start + request.lines])
        end = start + request.lines
        return ReadReply(
            ref=request.ref,
            total_bytes=len(data),
            total_lines=len(lines),
            offset=len("".join(lines[:start]).encode()),
            content=chunk,
            next_offset=None,
            line=request.line,
            next_line=end + 1 if end < len(lines) else None,
            sha256_verified=True,
        )
    end = min(len(data), request.offset + request.length)
    # Never split a UTF-8 character: move the end back to a character boundary.
    while end < len(data) and end > request.offset and (data[end] & 0xC0) == 0x80:
        end -= 1
    return ReadReply(
        ref=request.ref,
        total_bytes=len(data),
        total_lines=len(lines),
        offset=request.offset,
        content=data[request.offset : end].decode("utf-8", errors="replace"),
        next_offset=end if end < len(data) else None,
        sha256_verified=True,
    )
