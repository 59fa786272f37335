"""The recorder's own connections: apart from the pool background passes draw from, planned once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from services.edge.client import FleetClient
from tests.fixtures.builders import Thread, prepare_request
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def test_the_recorder_records_through_its_own_pool_on_generic_plans(
    start_fleet: Callable[..., Awaitable[Fleet]], client: FleetClient
) -> None:
    fleet = await start_fleet(db_recorder_pool_size=2)
    assert fleet.recorder_pool is not None and fleet.pool is not None
    assert fleet.recorder_pool is not fleet.pool
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    prepared = await client.prepare(prepare_request(t, after_event_key="k1", wait_ms=10_000))
    assert prepared.messages
    # Every connection of the recorder's pool, reused or not, keeps the setting its init made.
    async with fleet.recorder_pool.acquire() as a, fleet.recorder_pool.acquire() as b:
        modes = {await a.fetchval("SHOW plan_cache_mode"), await b.fetchval("SHOW plan_cache_mode")}
    assert modes == {"force_generic_plan"}
    # The shared pool keeps PostgreSQL's choice: a search's optional filters want argument-bound plans.
    async with fleet.pool.acquire() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "auto"


async def test_a_process_without_the_recorder_opens_no_recorder_pool(
    start_fleet: Callable[..., Awaitable[Fleet]],
) -> None:
    fleet = await start_fleet(workers="assembler")
    assert fleet.recorder_pool is None
