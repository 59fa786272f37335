"""Served history in PostgreSQL: steps numbered per thread in the order stored, a context stored once,
a block's text once per thread, and a thread's steps bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from services.core.served import ServedContext, served_of
from services.store import listing
from services.store.final_checks import SERVED_STEPS_KEPT, PgGatewayStore
from tests.fixtures.builders import Thread, assembled

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    created = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        yield created
    finally:
        await created.close()


def _served(t: Thread, questions: int) -> tuple[ServedContext, dict[str, str]]:
    events = [t.system("You are careful.")] + [t.user(f"question {n}") for n in range(questions)]
    return served_of(assembled(t, events, budget_tokens=20_000), "default")


async def test_insert_served_many_numbers_steps_per_thread_and_stores_each_once(pool: asyncpg.Pool) -> None:
    store = PgGatewayStore(pool)
    t, other = Thread(), Thread()
    one, texts_one = _served(t, 1)
    two, texts_two = _served(t, 2)
    elsewhere, _ = _served(other, 1)
    rows = [(t.thread_id, d, "default", text) for d, text in {**texts_one, **texts_two}.items()]
    await store.insert_served_many([one, elsewhere], rows[:1])
    await store.insert_served_many([one, two], rows)  # ``one`` again: kept as it was
    async with pool.acquire() as conn:
        steps = await listing.select_served(conn, t.thread_id)
        texts = await listing.select_served_texts(conn, t.thread_id, [b.digest for b in two.blocks])
        theirs = await listing.select_served(conn, other.thread_id)
    assert [(s.step, s.served) for s in steps] == [(1, one), (2, two)]
    assert [(s.step, s.served) for s in theirs] == [(1, elsewhere)]
    assert texts == {b.digest: texts_two[b.digest] for b in two.blocks}


async def test_insert_served_many_keeps_only_a_threads_newest_steps(pool: asyncpg.Pool) -> None:
    store = PgGatewayStore(pool)
    t = Thread()
    one, _ = _served(t, 1)
    many = [one.model_copy(update={"prepared_id": f"p{n}"}) for n in range(SERVED_STEPS_KEPT + 2)]
    await store.insert_served_many(many, [])
    async with pool.acquire() as conn:
        steps = await listing.select_served(conn, t.thread_id)
    assert len(steps) == SERVED_STEPS_KEPT
    assert (steps[0].step, steps[-1].step) == (3, SERVED_STEPS_KEPT + 2)
    assert steps[-1].served.prepared_id == f"p{SERVED_STEPS_KEPT + 1}"


async def test_insert_served_many_numbers_each_step_once_when_replicas_store_at_once(
    pool: asyncpg.Pool,
) -> None:
    t = Thread()
    one, _ = _served(t, 1)
    replicas = [PgGatewayStore(pool), PgGatewayStore(pool)]
    contexts = [one.model_copy(update={"prepared_id": f"p{n}"}) for n in range(8)]
    await asyncio.gather(*(replicas[n % 2].insert_served_many([c], []) for n, c in enumerate(contexts)))
    async with pool.acquire() as conn:
        steps = await listing.select_served(conn, t.thread_id)
    assert [s.step for s in steps] == list(range(1, 9))
    assert {s.served.prepared_id for s in steps} == {c.prepared_id for c in contexts}
