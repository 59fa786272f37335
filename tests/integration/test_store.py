"""The ledger repositories against PostgreSQL: optimistic concurrency and error translation."""

from __future__ import annotations

import asyncpg
import pytest

from services.errors import RevisionConflict, StoreUnavailable
from services.core.ledger import RecordingLimits, decode_batch, plan_batch
from services.store._errors import translate_pg_errors
from services.store.batches import read_for_batch, write_plan
from services.store.ledger import HeadsRepo
from services.core.tokens import ENCODINGS, counter_for
from tests.fixtures.builders import Thread, incoming

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

COUNTERS = {n: counter_for(n) for n in ENCODINGS}
LIMITS = RecordingLimits()


async def _plan_from_db(db: asyncpg.Connection, events: list) -> object:  # type: ignore[type-arg]
    decoded = decode_batch(incoming(events), LIMITS)
    t = events[0]
    reads = await read_for_batch(db, [t.thread_id], [(t.thread_id, e.event_key) for e in events], [])
    return plan_batch(decoded, reads, LIMITS, COUNTERS)


async def test_write_plan_with_a_stale_revision_raises_revision_conflict_and_writes_nothing(
    db: asyncpg.Connection,
) -> None:
    t = Thread()
    first = await _plan_from_db(db, [t.user("one")])
    async with db.transaction():
        await write_plan(db, first, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    # Two writers plan against the same head; the second to commit must lose, not interleave.
    a = await _plan_from_db(db, [t.user("from a")])
    b = await _plan_from_db(db, [t.user("from b")])
    async with db.transaction():
        await write_plan(db, a, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    with pytest.raises(RevisionConflict) as err:
        async with db.transaction():
            await write_plan(db, b, recorded_by="b", keep_raw=1024)  # type: ignore[arg-type]
    assert err.value.details == {"thread_id": t.thread_id, "expected": 1, "actual": 2}
    head = await HeadsRepo.select_head(db, t.thread_id)
    assert head is not None and (head.revision, head.last_seq) == (2, 2)
    rows = await db.fetch("SELECT recorded_by FROM ctx.records WHERE thread_id=$1 ORDER BY seq", t.thread_id)
    assert [r["recorded_by"] for r in rows] == ["a", "a"]


async def test_two_first_writers_of_a_new_thread_conflict_instead_of_both_creating_it(
    db: asyncpg.Connection,
) -> None:
    t = Thread()
    a = await _plan_from_db(db, [t.user("a")])
    b = await _plan_from_db(db, [t.user("b", key="other")])
    async with db.transaction():
        await write_plan(db, a, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    with pytest.raises(RevisionConflict):
        async with db.transaction():
            await write_plan(db, b, recorded_by="b", keep_raw=1024)  # type: ignore[arg-type]


async def test_translate_pg_errors_maps_lost_connections_to_store_unavailable(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    await conn.close()
    with pytest.raises(StoreUnavailable) as err:
        with translate_pg_errors():
            await conn.fetchval("SELECT 1")
    assert err.value.retryable


async def test_translate_pg_errors_maps_a_duplicate_seq_to_revision_conflict(db: asyncpg.Connection) -> None:
    t = Thread()
    plan = await _plan_from_db(db, [t.user("x")])
    async with db.transaction():
        await write_plan(db, plan, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    await db.execute(
        "UPDATE ctx.thread_heads SET revision = 1, last_seq = 0"
    )  # a head that lies about its seq
    replay = await _plan_from_db(db, [t.user("y", key="fresh")])
    with pytest.raises(RevisionConflict):
        with translate_pg_errors(t.thread_id):
            async with db.transaction():
                await write_plan(db, replay, recorded_by="b", keep_raw=1024)  # type: ignore[arg-type]
