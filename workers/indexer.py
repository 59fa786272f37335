"""indexer: keeps the full-text index of every thread up to date, off the record and prepare paths.

Fed by recorder notices (queue group ``indexer``) and a sweep of threads recorded past their index
position, so a stopped indexer catches up from its positions when it is back.
"""

from __future__ import annotations

import logging

import asyncpg

from services.indexing import index_thread, stale_threads

from .coalescing import CoalescingScheduler, recorded_notices
from .metrics import FleetMetrics

__all__ = ["IndexerWorker"]

log = logging.getLogger("ctxfleet.indexer")


class IndexerWorker:
    """Coalescing indexer of threads."""

    def __init__(self, pool: asyncpg.Pool | None, metrics: FleetMetrics) -> None:
        self._pool = pool
        self._metrics = metrics
        self._scheduler = CoalescingScheduler(self._index, self._stale, log) if pool is not None else None
        self.router = recorded_notices("indexer", "Recorder notices: index the thread's new records.", self.schedule)

    def schedule(self, thread_id: str) -> None:
        """Index ``thread_id`` soon (once more if it is being indexed)."""
        if self._scheduler is not None:
            self._scheduler.schedule(thread_id)

    async def _index(self, thread_id: str) -> None:
        assert self._pool is not None
        self._metrics.indexed_records.inc(await index_thread(self._pool, thread_id))

    async def _stale(self) -> list[str]:
        assert self._pool is not None
        return list(await stale_threads(self._pool))

    @property
    def backlog(self) -> int:
        """Threads waiting for this worker (its ``ctx_consumer_lag``)."""
        return self._scheduler.backlog if self._scheduler is not None else 0

    async def start(self) -> None:
        """Start the catch-up sweep."""
        if self._scheduler is not None:
            self._scheduler.start()

    async def stop(self) -> None:
        """Stop sweeping; let running indexing finish."""
        if self._scheduler is not None:
            await self._scheduler.stop()
