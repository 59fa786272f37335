"""The assembler's service: answer prepares and inspections from Postgres.

Read-your-writes: a request naming ``after_event_key`` is answered only once the ledger holds that
event (or says it was rejected); the wait is driven by recorder notices and bounded by the
request's ``wait_ms``. Records are cached per thread and read incrementally: the ledger is
append-only, so a cached prefix never goes stale and a prepare reads only what is new.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

import asyncpg

from contracts import (
    InspectedRecord,
    InspectRequest,
    PreparedContext,
    PrepareRequest,
    ThreadInspection,
    thread_id_of,
)

from .assemble import ThreadSnapshot, assemble_context
from .budget import BUILTIN_PROFILES, resolve_budget
from .errors import EventRejected, NotYetRecorded, ThreadNotFound
from .hashing import verify_chain
from .notices import NoticeBoard
from .records import LedgerRecord
from .store._errors import translate_pg_errors
from .store.ledger import Conn, DeadLettersRepo, HeadsRepo, RecordsRepo, StoredHead
from .tokens import ENCODINGS, EncodingName, counter_for

__all__ = ["PrepareService"]


def _encoding(name: str) -> EncodingName:
    for known in ENCODINGS:
        if known == name:
            return known
    raise ValueError(f"no shipped encoding {name!r}")

# Notices are hints; a waiter re-checks the ledger at least this often even if one is lost.
_RECHECK_S = 0.25


@dataclass
class _Cached:
    last_seq: int
    records: list[LedgerRecord]


class PrepareService:
    """Prepares contexts and inspections for any thread."""

    def __init__(self, pool: asyncpg.Pool, board: NoticeBoard, *, cache_threads: int = 1024) -> None:
        self._pool = pool
        self._board = board
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._cache_threads = cache_threads
        self._locks: dict[str, asyncio.Lock] = {}

    async def prepare(self, request: PrepareRequest) -> PreparedContext:
        """The prepared context of the request's thread, reflecting its watermark event."""
        thread_id = thread_id_of(request.run_id, request.instance_id)
        budget = resolve_budget(request, BUILTIN_PROFILES)
        if request.after_event_key is not None:
            await self._await_event(thread_id, request.after_event_key, request.wait_ms)
        async with self._pool.acquire() as conn:
            with translate_pg_errors(thread_id):
                head = await HeadsRepo.select_head(conn, thread_id)
                # Another session's thread is reported exactly like a missing one: no existence leak.
                if head is None or head.session_id != request.session_id:
                    raise ThreadNotFound(thread_id)
                records = await self._records(conn, thread_id, head)
        snapshot = ThreadSnapshot(
            session_id=head.session_id,
            run_id=head.run_id,
            instance_id=head.instance_id,
            revision=head.revision,
            last_seq=head.last_seq,
            last_event_key=head.last_event_key,
            records=records,
        )
        counter = None if budget.encoding == "estimate" else counter_for(_encoding(budget.encoding))
        return assemble_context(snapshot, request, budget, counter)

    async def inspect(self, thread_id: str, request: InspectRequest) -> ThreadInspection:
        """A thread's head, verified chain and latest records."""
        async with self._pool.acquire() as conn:
            with translate_pg_errors(thread_id):
                head = await HeadsRepo.select_head(conn, thread_id)
                if head is None:
                    raise ThreadNotFound(thread_id)
                count, tokens = await RecordsRepo.totals(conn, thread_id)
                chain_error = verify_chain(thread_id, await RecordsRepo.select_links(conn, thread_id))
                tail = await RecordsRepo.select_tail(conn, thread_id, limit=request.limit, preview_chars=160)
                open_calls = await HeadsRepo.open_call_ids(conn, thread_id)
                dead = await DeadLettersRepo.count(conn, thread_id)
        return ThreadInspection(
            thread_id=thread_id,
            session_id=head.session_id,
            revision=head.revision,
            record_count=count,
            total_tokens=tokens,
            last_event_key=head.last_event_key,
            chain_verified=chain_error is None,
            chain_error=chain_error,
            pending_call_ids=tuple(open_calls),
            dead_letters=dead,
            records=tuple(
                InspectedRecord(
                    seq=r["seq"],
                    session_seq=r["session_seq"],
                    kind=r["kind"],
                    event_key=r["event_key"],
                    tokens=r["tokens_o200k"],
                    content_sha256=r["content_sha256"],
                    record_hash=r["record_hash"],
                    blob_sha256=r["blob_sha256"],
                    preview=r["preview"],
                )
                for r in reversed(tail)
            ),
        )

    async def _await_event(self, thread_id: str, event_key: str, wait_ms: int) -> None:
        started = time.monotonic()
        deadline = started + wait_ms / 1000
        with self._board.waiting(thread_id) as woken:
            while True:
                woken.clear()
                async with self._pool.acquire() as conn:
                    with translate_pg_errors(thread_id):
                        if await RecordsRepo.find_event(conn, thread_id, event_key) is not None:
                            return
                        rejected = await DeadLettersRepo.find(conn, thread_id, event_key)
                if rejected is not None:
                    raise EventRejected(event_key, rejected[0], rejected[1])
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NotYetRecorded(thread_id, event_key, int((time.monotonic() - started) * 1000))
                try:
                    await asyncio.wait_for(woken.wait(), timeout=min(remaining, _RECHECK_S))
                except TimeoutError:
                    pass

    async def _records(self, conn: Conn, thread_id: str, head: StoredHead) -> list[LedgerRecord]:
        lock = self._locks.setdefault(thread_id, asyncio.Lock())
        async with lock:
            cached = self._cache.get(thread_id)
            if cached is None:
                cached = _Cached(0, [])
            if cached.last_seq < head.last_seq:
                new = await RecordsRepo.select_records(conn, thread_id, gt=cached.last_seq, lte=head.last_seq)
                cached = _Cached(head.last_seq, cached.records + new)
            self._cache[thread_id] = cached
            self._cache.move_to_end(thread_id)
            while len(self._cache) > self._cache_threads:
                evicted, _ = self._cache.popitem(last=False)
                self._locks.pop(evicted, None)
            # A later head may already be cached by a concurrent prepare: serve exactly this head.
            return [r for r in cached.records if r.seq <= head.last_seq]
