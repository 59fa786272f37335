"""The indexer's service: chunk and index each thread's records after its last indexed position.

Idempotent and gap-free by construction: a thread's chunks and its new position commit in one
transaction, chunks are keyed by (thread, seq, chunk), and a thread is read from its position on —
a stopped indexer catches up from where it was, never twice, never skipping.

No record holds a thread back (a deterministic failure is never retried):

1. A record's searchable text is indexed up to ``MAX_INDEXED_BYTES`` (its head; counted as cut):
   the rest stays readable through ``ctx.read``, and a pass over a huge paste stays bounded.
2. A chunk never exceeds ~4 KiB, a line longer than that included (cut at a space where there is
   one): PostgreSQL refuses a tsvector over 1 MB, so one 8 MiB line made a single chunk it refused.
3. A record the store still refuses for its content is skipped with the reason (``IndexPass.skipped``)
   and the position moves past it, so the thread's other records are indexed and no pass or restart
   tries it again.
"""

from __future__ import annotations

from contracts import EventKind

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import assert_never

from services.store.ports import IndexStore
from services.store.search import SkippedRecord

__all__ = [
    "INDEX_VERSION",
    "MAX_INDEXED_BYTES",
    "IndexPass",
    "chunk_text",
    "index_thread",
    "reindex",
    "stale_threads",
]

# Bump when chunking or the text configuration changes: reindexing migrates the index. Not bumped for
# invariant 2: a line of at most 4 KiB is chunked as before, and a longer one indexed before is a
# valid (if coarse) chunk still.
INDEX_VERSION = 1
_CHUNK_BYTES = 4096
# Invariant 1: what one record adds to the index at most (256 chunks).
MAX_INDEXED_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class IndexPass:
    """What a pass over a thread did: records indexed (cut ones and skipped ones included)."""

    records: int = 0
    # Records whose searchable text was longer than MAX_INDEXED_BYTES: indexed up to it.
    cut: int = 0
    skipped: tuple[SkippedRecord, ...] = ()


def chunk_text(text: str) -> list[tuple[int, int, int, int, str]]:
    """``(start_byte, end_byte, start_line, end_line, text)`` chunks of whole lines, ~4 KiB each; a
    longer line is cut into pieces of at most 4 KiB (invariant 2)."""
    chunks: list[tuple[int, int, int, int, str]] = []
    start_byte = byte = 0
    start_line = line_no = last_line = 1
    current: list[str] = []
    size = 0
    for piece, n, line_ends in _pieces(text.splitlines(keepends=True) or [""]):
        if current and size + n > _CHUNK_BYTES:
            chunks.append((start_byte, byte, start_line, last_line, "".join(current)))
            current, size, start_byte, start_line = [], 0, byte, line_no
        current.append(piece)
        size += n
        byte += n
        last_line = line_no
        line_no += line_ends
    chunks.append((start_byte, byte, start_line, last_line, "".join(current)))
    return chunks


def _pieces(lines: list[str]) -> Iterator[tuple[str, int, bool]]:
    """Each line, or the pieces of one over ``_CHUNK_BYTES``: ``(text, its bytes, ends the line)``."""
    for line in lines:
        data = line.encode("utf-8")
        if len(data) <= _CHUNK_BYTES:
            yield line, len(data), True
            continue
        start = 0
        while len(data) - start > _CHUNK_BYTES:
            cut = start + _CHUNK_BYTES
            while data[cut] & 0xC0 == 0x80:  # not inside a character
                cut -= 1
            space = data.rfind(b" ", start + _CHUNK_BYTES // 2, cut)
            if space >= 0:  # not inside a word, where there is a space to cut after
                cut = space + 1
            yield data[start:cut].decode("utf-8"), cut - start, False
            start = cut
        yield data[start:].decode("utf-8"), len(data) - start, True


def _head(text: str, limit: int) -> str | None:
    """``text`` up to ``limit`` bytes (whole characters), or ``None`` when it is within the limit."""
    if len(text) * 4 <= limit:  # no character is longer than 4 bytes: short without encoding
        return None
    data = text.encode("utf-8")
    if len(data) <= limit:
        return None
    return data[:limit].decode("utf-8", "ignore")


def _searchable(kind: str, text: str, payload: str) -> str:
    return f"{text}\n{payload}" if _payload_is_searchable(EventKind(kind)) else text


def _payload_is_searchable(kind: EventKind) -> bool:
    """Whether a record's payload holds words to find: tool calls (names and arguments), patches, resources
    and child results live there; messages and outcomes are all in the text."""
    match kind:
        case (
            EventKind.ASSISTANT_MESSAGE
            | EventKind.STATE_PATCH
            | EventKind.RESOURCE_ACTIVATED
            | EventKind.CHILD_RESULT
        ):
            return True
        case (
            EventKind.SYSTEM
            | EventKind.USER_INPUT
            | EventKind.TOOL_OUTCOME
            | EventKind.RUN_STATUS
            | EventKind.CONTEXT_EXPORT
            | EventKind.CONTEXT_RESET
            | EventKind.OPERATION_RECONCILE
            | EventKind.PHASE_CHANGE
        ):
            return False
        case _:
            assert_never(kind)


async def index_thread(store: IndexStore, thread_id: str, *, batch: int = 500) -> IndexPass:
    """Index every record of ``thread_id`` after its position; what was indexed, cut and skipped.

    A step that indexed fewer than ``batch`` records reached the thread's end: the pass stops there
    instead of asking once more to learn that nothing is left (a transaction of its own, on every
    pass). A record recorded meanwhile comes with its own notice, or the sweep finds it.
    """
    done = IndexPass()
    while True:
        cut = 0

        def chunks(kind: str, text: str, payload: str) -> list[tuple[int, int, int, int, str]]:
            nonlocal cut
            searchable = _searchable(kind, text, payload)
            head = _head(searchable, MAX_INDEXED_BYTES)
            if head is not None:
                cut += 1
            return chunk_text(searchable if head is None else head)

        step = await store.index_next(thread_id, batch=batch, version=INDEX_VERSION, chunker=chunks)
        # Counted once the step's position committed: a failed step is tried again, and counted then.
        done = IndexPass(done.records + step.records, done.cut + cut, done.skipped + step.skipped)
        if step.records < batch:
            return done


async def stale_threads(store: IndexStore, limit: int = 500) -> list[str]:
    """Threads recorded past their index position (or indexed under an older index version)."""
    return await store.stale_index_threads(limit, INDEX_VERSION)


async def reindex(
    index: IndexStore,
    session_id: str | None = None,
    *,
    on_thread: Callable[[int, int], None] | None = None,
) -> int:
    """Drop and rebuild the index of one session (or of everything) from the ledger.

    ``on_thread(done, total)`` is called as each thread is reindexed (the CLI's progress bar).
    """
    threads = await index.reset_index(session_id)
    # A few threads at once: each is its own transaction, and the pool bounds the fan-out anyway.
    gate = asyncio.Semaphore(4)
    done = 0

    async def one(thread_id: str) -> int:
        nonlocal done
        async with gate:
            indexed = (await index_thread(index, thread_id)).records
        done += 1
        if on_thread is not None:
            on_thread(done, len(threads))
        return indexed

    return sum(await asyncio.gather(*(one(t) for t in threads)))
