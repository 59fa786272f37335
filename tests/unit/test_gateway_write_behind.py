"""The gateway's write-behind: records stored in batches, once per prepared id, after the prepares."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from contracts import PreparedContext
from services.app.gateway import GatewayService
from services.core.gateway_check import GatewayRecord, gateway_record
from services.store.gateway import MemoryGatewayStore, MemoryHookGrants
from tests.fixtures.builders import Thread, assembled
from workers.hot_path import HotPath

pytestmark = pytest.mark.anyio


class _CountingStore(MemoryGatewayStore):
    def __init__(self) -> None:
        super().__init__()
        self.statements: list[int] = []

    async def insert_prepared_many(self, records: Sequence[GatewayRecord]) -> None:
        self.statements.append(len(records))
        await super().insert_prepared_many(records)


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


async def test_write_behind_waits_for_the_prepares_in_progress() -> None:
    store = _CountingStore()
    hot = HotPath(max_defer_s=5.0)
    service = GatewayService(store, MemoryHookGrants(), before_write=hot.yield_to_prepares)
    prepared = _prepared("while serving")
    with hot.serving():
        service.remember(prepared, "default")
        await asyncio.sleep(0.05)
        assert store.statements == []
    await asyncio.wait_for(service.flush(), timeout=1.0)
    assert store.statements == [1]
    assert service.dropped_writes == 0


async def test_write_behind_keeps_the_carried_check_with_the_record() -> None:
    store = _CountingStore()
    service = GatewayService(store, MemoryHookGrants())
    prepared = _prepared("carried")
    service.remember(prepared, "default", carried_from="abc/1")
    await service.flush()
    assert store.prepared[(prepared.prepared_id, prepared.format)].carried_from == "abc/1"
