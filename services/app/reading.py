"""Read-back of stored content: a byte or line range of an output or a record, only for its own session."""

from __future__ import annotations

from typing import assert_never

from contracts import ReadReply, ReadRequest

from services.core.context_tools import BlobRef, RecordRef, parse_ref
from contracts.exceptions import ContentNotFound, IntegrityError
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
    """The requested range of an externalized output or of one record, re-read from the ledger.

    Only content a session of ``tenant`` recorded: another tenant's looks exactly like missing content.
    A blob is checked against its sha256 (``sha256_verified``); a record's inline text is the ledger's
    own, which its hash chain covers, not a content address.
    """
    ref = parse_ref(request.ref)
    match ref:
        case BlobRef(sha256=sha):
            content = await store.session_blob(tenant, request.session_id, sha, request.principal_id)
            if content is None:
                raise ContentNotFound(request.ref)
            return _range(request, verified_blob(content, sha), verified=True)
        case RecordRef(thread_id=thread_id, seq=seq):
            row = await store.session_record(tenant, request.session_id, thread_id, seq, request.principal_id)
            if row is None:
                raise ContentNotFound(request.ref)
            if row.blob is not None and row.blob_sha256 is not None:
                return _range(request, verified_blob(row.blob, row.blob_sha256), verified=True)
            return _range(request, (row.text or "").encode("utf-8"), verified=False)
        case None:
            raise ContentNotFound(request.ref)
        case _:
            assert_never(ref)


def _range(request: ReadRequest, data: bytes, *, verified: bool) -> ReadReply:
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
            sha256_verified=verified,
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
        sha256_verified=verified,
    )
