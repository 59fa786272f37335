"""The indexer's service: chunk and index each thread's records after its last indexed position.

Idempotent and gap-free by construction: a thread's chunks and its new position commit in one
transaction, chunks are keyed by (thread, seq, chunk), and a thread is read from its position on —
a stopped indexer catches up from where it was, never twice, never skipping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import assert_never

from services.core.records import RecordKind
from services.store.ports import IndexStore

__all__ = ["INDEX_VERSION", "chunk_text", "index_thread", "reindex", "stale_threads"]

# Bump when chunking or the text configuration changes: reindexing migrates the index.
INDEX_VERSION = 1
_CHUNK_BYTES = 4096


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
    return f"{text}\n{payload}" if _payload_is_searchable(RecordKind(kind)) else text


def _payload_is_searchable(kind: RecordKind) -> bool:
    """Whether a record's payload holds words to find: tool calls (names and arguments), patches, resources
    and child results live there; messages and outcomes are all in the text."""
    match kind:
        case (
            RecordKind.ASSISTANT_MESSAGE
            | RecordKind.STATE_PATCH
            | RecordKind.RESOURCE_ACTIVATED
            | RecordKind.CHILD_RESULT
        ):
            return True
        case (
            RecordKind.SYSTEM
            | RecordKind.USER_INPUT
            | RecordKind.TOOL_OUTCOME
            | RecordKind.RUN_STATUS
            | RecordKind.CONTEXT_EXPORT
            | RecordKind.CONTEXT_RESET
            | RecordKind.OPERATION_RECONCILE
            | RecordKind.PHASE_CHANGE
        ):
            return False
        case _:
            assert_never(kind)


def _chunks(kind: str, text: str, payload: str) -> list[tuple[int, int, int, int, str]]:
    return chunk_text(_searchable(kind, text, payload))


async def index_thread(store: IndexStore, thread_id: str, *, batch: int = 500) -> int:
    """Index every record of ``thread_id`` after its position; returns how many were indexed.

    A step that indexed fewer than ``batch`` records reached the thread's end: the pass stops there
    instead of asking once more to learn that nothing is left (a transaction of its own, on every
    pass). A record recorded meanwhile comes with its own notice, or the sweep finds it.
    """
    total = 0
    while True:
        n = await store.index_next(thread_id, batch=batch, version=INDEX_VERSION, chunker=_chunks)
        total += n
        if n < batch:
            return total


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
            indexed = await index_thread(index, thread_id)
        done += 1
        if on_thread is not None:
            on_thread(done, len(threads))
        return indexed

    return sum(await asyncio.gather(*(one(t) for t in threads)))
