"""indexer: keeps the full-text index of every thread up to date, off the record and prepare paths.

Fed by recorder notices (queue group ``indexer``) and a sweep of threads recorded past their index
position, so a stopped indexer catches up from its positions when it is back.
"""

from __future__ import annotations

import logging

import asyncpg
from faststream import Path
from faststream.nats import NatsRouter

from contracts.subjects import RECORDED
from services.indexing import index_thread, stale_threads

from .coalescing import CoalescingScheduler
from .metrics import FleetMetrics
from .replies import raw_body

__all__ = ["IndexerWorker"]

log = logging.getLogger("ctxfleet.indexer")


class IndexerWorker:
    """Coalescing indexer of threads."""

    def __init__(self, pool: asyncpg.Pool | None, metrics: FleetMetrics) -> None:
        self._pool = pool
        self._metrics = metrics
        self._scheduler = CoalescingScheduler(self._index, self._stale, log) if pool is not None else None
        self.router = NatsRouter()

        @self.router.subscriber(
            f"{RECORDED}.{{run_id}}.{{instance_id}}", queue="indexer", decoder=raw_body, title="indexer",
            description="Recorder notices: index the thread's new records.",
        )
        async def on_recorded(body: bytes, run_id: str = Path(), instance_id: str = Path()) -> None:
            self.schedule(f"{run_id}.{instance_id}")

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

    async def start(self) -> None:
        """Start the catch-up sweep."""
        if self._scheduler is not None:
            self._scheduler.start()

    async def stop(self) -> None:
        """Stop sweeping; let running indexing finish."""
        if self._scheduler is not None:
            await self._scheduler.stop()
