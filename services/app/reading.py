"""Read-back of stored content: a verified byte or line range, only for the session that owns it."""

from __future__ import annotations

from contracts import ReadReply, ReadRequest

from services.errors import ContentNotFound, IntegrityError
from services.core.hashing import sha256_hex
from services.store.ports import QueryStore

__all__ = ["read_range", "verified_blob"]


def verified_blob(content: bytes, sha: str) -> bytes:
    """``content`` if it still hashes to ``sha``; an integrity error, never lookalike content, otherwise."""
    actual = sha256_hex(content)
    if actual != sha:
        raise IntegrityError(f"ctx://blob/{sha}", actual)
    return content


async def read_range(store: QueryStore, request: ReadRequest, *, tenant: str) -> ReadReply:
    """The requested range after re-reading the content and checking its sha256.

    Only content a session of ``tenant`` recorded: another tenant's looks exactly like missing content.
    """
    sha = request.ref.rsplit("/", 1)[1]
    content = await store.session_blob(tenant, request.session_id, sha, request.principal_id)
    if content is None:
        raise ContentNotFound(request.ref)
    data = verified_blob(content, sha)
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
