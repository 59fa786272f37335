"""indexer: keeps the full-text index of every thread up to date, off the record and prepare paths.

Fed by recorder notices (queue group ``indexer``) and a sweep of threads recorded past their index
position, so a stopped indexer catches up from its positions when it is back.
"""

from __future__ import annotations

import logging

from services.app.indexing import MAX_INDEXED_BYTES, index_thread, stale_threads
from services.store.postgres import PgStore

from .coalescing import CoalescingScheduler, CoalescingWorker, recorded_notices
from .metrics import FleetMetrics
from .prepares_first import PreparesFirst

__all__ = ["IndexerWorker"]

log = logging.getLogger("ctxfleet.indexer")
# A thread being recorded into is indexed at most this often: one pass then takes every record
# since the last, instead of a pass (and its transaction) per recorded batch.
_MIN_INTERVAL_S = 0.25


class IndexerWorker(CoalescingWorker):
    """Coalescing indexer of threads."""

    def __init__(
        self, store: PgStore | None, metrics: FleetMetrics, *, prepares: PreparesFirst | None = None
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._scheduler = (
            CoalescingScheduler(
                self._index,
                self._stale,
                log,
                min_interval_s=_MIN_INTERVAL_S,
                before_pass=prepares.before_pass if prepares is not None else None,
            )
            if store is not None
            else None
        )
        self.router = recorded_notices(
            "indexer", "Recorder notices: index the thread's new records.", self.schedule
        )

    async def _index(self, thread_id: str) -> None:
        assert self._store is not None
        done = await index_thread(self._store, thread_id)
        m = self._metrics
        m.indexed_records.inc(done.records - len(done.skipped))
        if done.cut:
            m.index_records_cut.inc(done.cut)
            log.info(
                "%s: %d records indexed up to their first %d bytes (the rest is readable, not searchable)",
                thread_id,
                done.cut,
                MAX_INDEXED_BYTES,
            )
        # Once each: the position moved past the record, so no pass (nor a restart) meets it again.
        for skipped in done.skipped:
            m.index_records_skipped.labels(sqlstate=skipped.sqlstate).inc()
            log.warning("%s: record %d not indexed: %s", thread_id, skipped.seq, skipped.reason)

    async def _stale(self) -> list[str]:
        assert self._store is not None
        return list(await stale_threads(self._store))
