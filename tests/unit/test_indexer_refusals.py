"""The indexer never retries a record the store refuses to index: counted and logged once, passed for good."""

from __future__ import annotations

import logging

import pytest

from services.app import indexing
from services.app.indexing import stale_threads
from services.store.memory import MemoryStore
from tests.contract.test_store_contract import _write
from tests.fixtures.builders import Thread
from workers.indexer import IndexerWorker
from workers.metrics import FleetMetrics

pytestmark = pytest.mark.anyio


async def test_indexer_counts_and_logs_once_a_record_the_store_refuses_and_never_meets_it_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store, t, metrics = MemoryStore(), Thread(), FleetMetrics()
    huge = " ".join(f"w{n:07d}" for n in range(200_000))  # its first MiB alone is over the tsvector limit
    await _write(
        store,
        [t.user("before: parser", key="u1"), t.user(huge, key="u2"), t.user("after: parser", key="u3")],
    )
    # A record kept whole as one chunk, as before chunks were bounded: the store then refuses it.
    monkeypatch.setattr(indexing, "chunk_text", lambda text: [(0, len(text.encode()), 1, 1, text)])
    worker = IndexerWorker(store, metrics)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="ctxfleet.indexer"):
        await worker._index(t.thread_id)
        # What the sweep (or a restart) would do next: the position is past the record, nothing is left.
        assert await stale_threads(store) == []
        await worker._index(t.thread_id)

    sample = metrics.registry.get_sample_value
    assert sample("ctx_index_records_skipped_total", {"sqlstate": "54000"}) == 1
    assert sample("ctx_indexed_records_total") == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "record 2 not indexed" in warned[0] and "tsvector" in warned[0]
