"""indexer: keeps the full-text index of every thread up to date, off the record and prepare paths.

Fed by recorder notices (queue group ``indexer``) and a sweep of threads recorded past their index
position, so a stopped indexer catches up from its positions when it is back.
"""

from __future__ import annotations

import logging

from services.app.indexing import index_thread, stale_threads
from services.store.postgres import PgStore

from .coalescing import CoalescingScheduler, CoalescingWorker, recorded_notices
from .hot_path import HotPath
from .local_notices import LocalNotices
from .metrics import FleetMetrics

__all__ = ["IndexerWorker"]

log = logging.getLogger("ctxfleet.indexer")
# A thread being recorded into is indexed at most this often: one pass then takes every record
# since the last, instead of a pass (and its transaction) per recorded batch (issue 16).
_MIN_INTERVAL_S = 0.25


class IndexerWorker(CoalescingWorker):
    """Coalescing indexer of threads."""

    def __init__(
        self,
        store: PgStore | None,
        metrics: FleetMetrics,
        *,
        local: LocalNotices | None = None,
        hot_path: HotPath | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._scheduler = (
            CoalescingScheduler(
                self._index,
                self._stale,
                log,
                min_interval_s=_MIN_INTERVAL_S,
                before_pass=hot_path.await_quiet if hot_path is not None else None,
            )
            if store is not None
            else None
        )
        self.router = recorded_notices(
            "indexer", "Recorder notices: index the thread's new records.", self.schedule, local
        )

    async def _index(self, thread_id: str) -> None:
        assert self._store is not None
        self._metrics.indexed_records.inc(await index_thread(self._store, thread_id))

    async def _stale(self) -> list[str]:
        assert self._store is not None
        return list(await stale_threads(self._store))
