"""The gateway's record store, alike in PostgreSQL and its in-memory twin: batches, and first writer wins."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from services.core.gateway_check import GatewayRecord, gateway_record
from services.store.final_checks import MemoryGatewayStore, PgGatewayStore
from tests.fixtures.builders import Thread, assembled

pytestmark = pytest.mark.anyio


@pytest.fixture
async def gateway_store(store_url: str | None) -> AsyncIterator[Any]:
    if store_url is None:
        yield MemoryGatewayStore()
        return
    pool = await asyncpg.create_pool(store_url, min_size=1, max_size=2)
    try:
        yield PgGatewayStore(pool)
    finally:
        await pool.close()


def _record(question: str) -> GatewayRecord:
    t = Thread()
    prepared = assembled(t, [t.system("You are careful."), t.user(question)], budget_tokens=20_000)
    return gateway_record(prepared, "default", "o200k_base")


async def test_insert_prepared_many_stores_each_record_and_keeps_the_first_of_an_id(
    gateway_store: Any,
) -> None:
    first, second = _record("one"), _record("two")
    await gateway_store.insert_prepared(first)
    again = first.model_copy(update={"carried_from": "other/1"})
    await gateway_store.insert_prepared_many([again, second])
    await gateway_store.insert_prepared_many([])
    assert await gateway_store.select_prepared(first.prepared_id, first.format) == first
    assert await gateway_store.select_prepared(second.prepared_id, second.format) == second
    assert await gateway_store.select_prepared("missing", first.format) is None
