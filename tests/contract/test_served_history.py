"""A thread's served history, written by the gateway's store and listed by the console's, alike in
PostgreSQL and in the in-memory twin: steps numbered per thread, a context kept once, texts by digest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from services.core.served import ServedContext, served_of
from services.store.final_checks import PgGatewayStore
from services.store.memory import MemoryStore
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread, assembled

pytestmark = pytest.mark.anyio


@pytest.fixture
async def stores(store_url: str | None) -> AsyncIterator[tuple[Any, Any]]:
    """The gateway's store and the listing store of one database."""
    if store_url is None:
        memory = MemoryStore()
        yield memory.gateway, memory
        return
    pool = await asyncpg.create_pool(store_url, min_size=1, max_size=2)
    try:
        yield PgGatewayStore(pool), PgStore(pool)
    finally:
        await pool.close()


def _served(t: Thread, questions: int) -> tuple[ServedContext, dict[str, str]]:
    events = [t.system("You are careful.")] + [t.user(f"question {n}") for n in range(questions)]
    return served_of(assembled(t, events, budget_tokens=20_000), "default")


async def test_the_served_steps_the_gateway_kept_are_listed_in_order_with_their_texts(
    stores: tuple[Any, Any],
) -> None:
    gateway, listing = stores
    t, other = Thread(), Thread()
    one, texts_one = _served(t, 1)
    two, texts_two = _served(t, 2)
    elsewhere, _ = _served(other, 1)
    rows = [(t.thread_id, d, "default", text) for d, text in {**texts_one, **texts_two}.items()]
    await gateway.insert_served_many([one, elsewhere], rows[:1])
    await gateway.insert_served_many([one, two], rows)  # ``one`` again: kept as it was

    steps = await listing.thread_served(t.thread_id)
    assert [(s.step, s.served) for s in steps] == [(1, one), (2, two)]
    assert steps[0].served_at <= steps[1].served_at
    assert [(s.step, s.served) for s in await listing.thread_served(other.thread_id)] == [(1, elsewhere)]
    digests = [b.digest for b in two.blocks]
    assert await listing.served_texts(t.thread_id, [*digests, "no-such-digest"]) == {
        d: texts_two[d] for d in digests
    }
    assert await listing.served_texts(other.thread_id, digests) == {}
    assert await listing.thread_served("no-such-thread") == []
