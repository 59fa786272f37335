"""A connection of the store's pool asks PostgreSQL for the types it needs as it opens, not inside the
first request that runs a statement using one (a catalog query of 3-12 ms each, up to four
per new connection, seen in PostgreSQL's log of the read-your-writes benchmark).

asyncpg reports its own catalog queries to a connection's query logger, so the statements sent are
counted as in ``test_batch_statements.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from services.core.ledger import BatchKeys
from services.store.batches import read_for_batch
from services.store.connect import create_pool
from services.store.thread_at_head import read_thread_at_head

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

_INTROSPECTION = "typeinfo_tree"


def _logging(seen: list[str]) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: seen.append(record.query))

    return init


async def _hot_statements(conn: asyncpg.Connection) -> None:
    """A view load (the records come back as an array of anonymous rows) and a batch's reads."""
    await read_thread_at_head(conn, "run.main", None, facts_of_revision=None, records_after=0)
    wanted = BatchKeys(["run.main"], [("run.main", "k")], [("run.main", "c")], ["s"], ["run"])
    await read_for_batch(conn, wanted, tracking=("x", 0))


async def test_a_new_connection_of_the_pool_runs_the_hot_statements_without_asking_for_types(
    database_url: str,
) -> None:
    seen: list[str] = []
    pool = await create_pool(database_url, min_size=1, max_size=1, init=_logging(seen))
    try:
        async with pool.acquire() as conn:
            await _hot_statements(conn)
    finally:
        await pool.close()
    assert len(seen) == 2, seen
    assert not [q for q in seen if _INTROSPECTION in q]


async def test_without_the_priming_the_first_view_load_on_a_connection_asks_for_types(
    database_url: str,
) -> None:
    # What the priming saves: a plain asyncpg connection asks inside the first statement that needs it.
    seen: list[str] = []
    conn = await asyncpg.connect(database_url)
    conn.add_query_logger(lambda record: seen.append(record.query))
    try:
        await _hot_statements(conn)
    finally:
        await conn.close()
    assert [q for q in seen if _INTROSPECTION in q]
