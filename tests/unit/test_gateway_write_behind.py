"""The gateway's write-behind: records stored in batches, once per prepared id;
kept through a store outage, bounded, and flushed on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from prometheus_client import generate_latest

from contracts import PreparedContext
from services.app.final_checks import GatewayService
from services.core.gateway_check import GatewayRecord, gateway_record
from contracts.exceptions import Overloaded, StoreRejected, StoreUnavailable
from services.store.final_checks import MemoryGatewayStore, MemoryHookGrants
from tests.fixtures.builders import Thread, assembled
from workers.metrics import FleetMetrics

pytestmark = pytest.mark.anyio


class _CountingStore(MemoryGatewayStore):
    """The twin, counting statements; unavailable for its first ``outage`` statements, and refusing
    every statement that holds a record of ``refused`` (as PostgreSQL refuses a whole statement)."""

    def __init__(self, outage: int = 0, refused: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.statements: list[int] = []
        self.outage = outage
        self.refused = refused

    async def insert_prepared_many(self, records: Sequence[GatewayRecord]) -> None:
        if self.outage > 0:
            self.outage -= 1
            raise StoreUnavailable("ConnectionRefusedError: [Errno 111] Connect call failed")
        if any(r.prepared_id in self.refused for r in records):
            raise StoreRejected("DataError", "22P02", "invalid input syntax")
        self.statements.append(len(records))
        await super().insert_prepared_many(records)


# Tries a millisecond apart: the test waits for the retries, not for a real backoff.
_FAST = (0.001, 0.004)


def _prepared(question: str) -> PreparedContext:
    t = Thread()
    return assembled(t, [t.system("You are careful."), t.user(question)], budget_tokens=20_000)


async def test_write_behind_stores_every_remembered_context_in_one_statement() -> None:
    store = _CountingStore()
    service = GatewayService(store, MemoryHookGrants())
    contexts = [_prepared(f"question {n}") for n in range(5)]
    for prepared in contexts:
        service.remember(prepared, "default")
    await service.flush()
    assert store.statements == [5]
    for prepared in contexts:
        assert store.prepared[(prepared.prepared_id, prepared.format)] == gateway_record(
            prepared, "default", "o200k_base"
        )


async def test_write_behind_stores_a_context_prepared_again_only_once() -> None:
    store = _CountingStore()
    service = GatewayService(store, MemoryHookGrants())
    prepared = _prepared("same view")
    service.remember(prepared, "default")
    await service.flush()
    service.remember(prepared, "default")
    service.remember(prepared, "default")
    await service.flush()
    assert store.statements == [1]


async def test_write_behind_keeps_the_carried_check_with_the_record() -> None:
    store = _CountingStore()
    service = GatewayService(store, MemoryHookGrants())
    prepared = _prepared("carried")
    service.remember(prepared, "default", carried_from="abc/1")
    await service.flush()
    assert store.prepared[(prepared.prepared_id, prepared.format)].carried_from == "abc/1"


async def test_write_behind_keeps_the_batch_and_stores_it_when_the_store_is_back_after_an_outage() -> None:
    store = _CountingStore(outage=3)
    service = GatewayService(store, MemoryHookGrants(), backoff_s=_FAST)
    contexts = [_prepared(f"during the outage {n}") for n in range(5)]
    for prepared in contexts:
        service.remember(prepared, "default")
    await asyncio.wait_for(service.flush(), timeout=5.0)
    assert store.statements == [5]  # the same batch, tried until the store took it
    assert set(store.prepared) == {(p.prepared_id, p.format) for p in contexts}
    assert service.retried_records == 3 * 5
    assert service.stored_records == 5
    assert service.pending_records == 0 and service.pending_bytes == 0
    assert not service.dropped_records


async def test_write_behind_logs_an_outage_once_however_many_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = _CountingStore(outage=20)
    service = GatewayService(store, MemoryHookGrants(), backoff_s=_FAST)
    with caplog.at_level(logging.INFO, logger="ctxfleet.gateway"):
        service.remember(_prepared("a long outage"), "default")
        await asyncio.wait_for(service.flush(), timeout=5.0)
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]  # failing, then stored again
    assert not any(r.exc_info for r in caplog.records)
    assert service.retried_records == 20 and service.stored_records == 1


async def test_write_behind_drops_only_the_record_the_store_refuses_and_logs_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = _prepared("refused")
    store = _CountingStore(refused=frozenset({bad.prepared_id}))
    service = GatewayService(store, MemoryHookGrants(), backoff_s=_FAST)
    good = [_prepared(f"kept {n}") for n in range(3)]
    with caplog.at_level(logging.ERROR, logger="ctxfleet.gateway"):
        for prepared in [good[0], bad, *good[1:]]:
            service.remember(prepared, "default")
        await asyncio.wait_for(service.flush(), timeout=5.0)
    assert set(store.prepared) == {(p.prepared_id, p.format) for p in good}
    assert store.statements == [1, 1, 1]  # the refused batch, stored a record at a time
    assert service.dropped_records == {"rejected": 1}
    assert len(caplog.records) == 1 and bad.prepared_id in caplog.records[0].getMessage()
    assert service.retried_records == 0


async def test_remember_answers_overloaded_when_the_pending_records_are_at_their_bound() -> None:
    store = _CountingStore(outage=1_000_000)
    service = GatewayService(store, MemoryHookGrants(), backoff_s=_FAST, max_pending_records=2)
    first, second, third = (_prepared(f"bounded {n}") for n in range(3))
    service.remember(first, "default")
    service.remember(second, "default")
    service.remember(second, "default")  # pending already: no second record, no refusal
    with pytest.raises(Overloaded) as refused:
        service.remember(third, "default")
    assert refused.value.retryable and refused.value.details["reason"] == "gateway_records_pending"
    assert service.refused_prepares == 1 and service.pending_records == 2

    store.outage = 0
    await asyncio.wait_for(service.flush(), timeout=5.0)
    service.remember(third, "default")  # room again once the store took the others
    await asyncio.wait_for(service.flush(), timeout=5.0)
    assert set(store.prepared) == {(p.prepared_id, p.format) for p in (first, second, third)}
    assert not service.dropped_records


async def test_remember_answers_overloaded_when_the_pending_bytes_are_at_their_bound() -> None:
    store = _CountingStore(outage=1_000_000)
    service = GatewayService(store, MemoryHookGrants(), backoff_s=_FAST, max_pending_bytes=1)
    service.remember(_prepared("one record"), "default")
    await asyncio.sleep(0.01)  # derived: its bytes are counted
    assert service.pending_bytes > 1
    with pytest.raises(Overloaded):
        service.remember(_prepared("one too many"), "default")
    await service.close(0.01)


async def test_close_stores_what_is_pending_when_the_store_comes_back_within_the_bound() -> None:
    store = _CountingStore(outage=4)
    # A long backoff: close cuts it short instead of waiting it out.
    service = GatewayService(store, MemoryHookGrants(), backoff_s=(0.001, 60.0))
    contexts = [_prepared(f"at shutdown {n}") for n in range(3)]
    for prepared in contexts:
        service.remember(prepared, "default")
    assert await asyncio.wait_for(service.close(5.0), timeout=6.0) == 0
    assert set(store.prepared) == {(p.prepared_id, p.format) for p in contexts}
    assert not service.dropped_records


async def test_close_counts_and_logs_what_it_could_not_store_within_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = _CountingStore(outage=1_000_000)
    service = GatewayService(store, MemoryHookGrants(), backoff_s=_FAST)
    for n in range(2):
        service.remember(_prepared(f"lost at shutdown {n}"), "default")
    with caplog.at_level(logging.ERROR, logger="ctxfleet.gateway"):
        assert await service.close(0.05) == 2
    assert service.dropped_records == {"shutdown": 2}
    assert service.pending_records == 0
    assert [r.levelname for r in caplog.records] == ["ERROR"]


async def test_gateway_metrics_export_the_write_behind_counts() -> None:
    store = _CountingStore(outage=1)
    service = GatewayService(store, MemoryHookGrants(), backoff_s=_FAST)
    metrics = FleetMetrics()
    metrics.watch_gateway(service)
    metrics.watch_gateway(service)  # once per registry, whoever asks again
    service.remember(_prepared("counted"), "default")
    await asyncio.wait_for(service.flush(), timeout=5.0)
    text = generate_latest(metrics.registry).decode()
    for line in (
        "ctx_gateway_pending_records 0.0",
        "ctx_gateway_records_stored_total 1.0",
        "ctx_gateway_record_retries_total 1.0",
        'ctx_gateway_records_dropped_total{reason="rejected"} 0.0',
        "ctx_gateway_prepares_refused_total 0.0",
    ):
        assert line in text.splitlines()
