"""The ledger repositories against PostgreSQL: optimistic concurrency and error translation."""

from __future__ import annotations

import asyncpg
import pytest

from contracts.exceptions import RevisionConflict, StoreUnavailable
from services.core.ledger import BatchKeys, RecordingLimits, decode_batch, plan_batch
from services.store._errors import translate_pg_errors
from services.store.batch_write import Position, one_statement
from services.store.batches import read_for_batch, write_plan
from services.store import ledger as store_heads
from services.core.tokens import ENCODINGS, counter_for
from tests.fixtures.builders import Thread, incoming

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

COUNTERS = {n: counter_for(n) for n in ENCODINGS}
LIMITS = RecordingLimits()


async def _plan_from_db(db: asyncpg.Connection, events: list) -> object:  # type: ignore[type-arg]
    decoded = decode_batch(incoming(events), LIMITS)
    t = events[0]
    calls = [(t.thread_id, e.payload.call_id) for e in events if e.kind == "tool_outcome"]
    reads = await read_for_batch(
        db, BatchKeys([t.thread_id], [(t.thread_id, e.event_key) for e in events], calls)
    )
    return plan_batch(decoded, reads, LIMITS, COUNTERS)


async def _loser_of_two_writers(db: asyncpg.Connection, t: Thread, events: list) -> object:  # type: ignore[type-arg]
    """After a first record of ``t``, two writers plan against the same head and "a" commits: the
    plan of ``events`` made beside it, which must lose, not interleave."""
    first = await _plan_from_db(db, [t.user("one")])
    async with db.transaction():
        await write_plan(db, first, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    a = await _plan_from_db(db, [t.user("from a")])
    b = await _plan_from_db(db, events)
    async with db.transaction():
        await write_plan(db, a, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    return b


async def test_write_plan_with_a_stale_revision_raises_revision_conflict_and_writes_nothing(
    db: asyncpg.Connection,
) -> None:
    t = Thread()
    b = await _loser_of_two_writers(db, t, [t.user("from b")])
    with pytest.raises(RevisionConflict) as err:
        async with db.transaction():
            await write_plan(db, b, recorded_by="b", keep_raw=1024)  # type: ignore[arg-type]
    assert err.value.details == {"thread_id": t.thread_id, "expected": 1, "actual": 2}
    head = await store_heads.select_head(db, t.thread_id)
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


async def test_a_call_and_its_outcome_in_one_batch_are_written_closed(db: asyncpg.Connection) -> None:
    # The batch's writes are one statement whose parts share a snapshot: the update closing calls
    # could not see a call inserted beside it, so the call is written with its outcome.
    t = Thread()
    plan = await _plan_from_db(
        db,
        [
            t.user("list it"),
            t.assistant(calls=(("c1", "ls", {"path": "."}), ("c2", "ls", {"path": "/"}))),
            t.outcome("c1", "a b"),
        ],
    )
    async with db.transaction():
        await write_plan(db, plan, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    rows = await db.fetch(
        "SELECT call_id, call_seq, outcome_seq, status FROM ctx.tool_calls WHERE thread_id = $1"
        " ORDER BY call_id",
        t.thread_id,
    )
    assert [tuple(r) for r in rows] == [("c1", 2, 3, "success"), ("c2", 2, None, None)]
    # An outcome for a call an earlier batch recorded closes it in place.
    later = await _plan_from_db(db, [t.outcome("c2", "etc", status="error")])
    async with db.transaction():
        await write_plan(db, later, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    status = await db.fetchval(
        "SELECT status FROM ctx.tool_calls WHERE thread_id = $1 AND call_id = 'c2'", t.thread_id
    )
    assert status == "error"


@pytest.mark.parametrize("in_transaction", [False, True], ids=["committing_by_itself", "in_a_transaction"])
async def test_a_writer_that_lost_the_head_leaves_no_session_number_call_or_position_behind(
    db: asyncpg.Connection, in_transaction: bool
) -> None:
    t = Thread()
    b = await _loser_of_two_writers(db, t, [t.assistant(calls=(("c9", "ls", {}),))])
    assert one_statement(b)  # type: ignore[arg-type]
    last_seq = await db.fetchval("SELECT last_seq FROM ctx.sessions WHERE session_id = $1", t.session_id)
    with pytest.raises(RevisionConflict) as err:
        if in_transaction:
            async with db.transaction():
                await write_plan(  # type: ignore[arg-type]
                    db, b, recorded_by="b", keep_raw=1024, position=Position("lost", 0, 99)
                )
        else:
            # No transaction around it: the statement's own guard undoes the session bump and position.
            await write_plan(  # type: ignore[arg-type]
                db, b, recorded_by="b", keep_raw=1024, position=Position("lost", 0, 99)
            )
    assert err.value.details == {"thread_id": t.thread_id, "expected": 1, "actual": 2}
    assert (
        await db.fetchval("SELECT last_seq FROM ctx.sessions WHERE session_id = $1", t.session_id) == last_seq
    )
    assert await db.fetchval("SELECT count(*) FROM ctx.tool_calls WHERE thread_id = $1", t.thread_id) == 0
    assert await db.fetchval("SELECT count(*) FROM ctx.tracking WHERE consumer = 'lost'") == 0


async def test_an_outcome_whose_call_another_writer_closed_fails_the_whole_write(
    db: asyncpg.Connection,
) -> None:
    t = Thread()
    first = await _plan_from_db(db, [t.user("list it"), t.assistant(calls=(("c1", "ls", {"path": "."}),))])
    await write_plan(db, first, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    late = await _plan_from_db(db, [t.outcome("c1", "a b")])
    assert one_statement(late)  # type: ignore[arg-type]
    # Another writer closed the call after this plan read it open (the head left as it was).
    await db.execute(
        "UPDATE ctx.tool_calls SET outcome_seq = 99, status = 'error' WHERE thread_id = $1", t.thread_id
    )
    before = await db.fetchval("SELECT last_seq FROM ctx.sessions WHERE session_id = $1", t.session_id)
    with pytest.raises(RevisionConflict):
        await write_plan(  # type: ignore[arg-type]
            db, late, recorded_by="b", keep_raw=1024, position=Position("closed", 0, 7)
        )
    head = await store_heads.select_head(db, t.thread_id)
    assert head is not None and head.last_seq == 2  # the head's move went with the statement
    assert (
        await db.fetchval("SELECT last_seq FROM ctx.sessions WHERE session_id = $1", t.session_id) == before
    )
    assert await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id = $1", t.thread_id) == 2
    assert await db.fetchval("SELECT count(*) FROM ctx.tracking WHERE consumer = 'closed'") == 0


async def test_a_plan_of_more_than_one_statement_is_written_whole_or_not_at_all(
    db: asyncpg.Connection,
) -> None:
    # A thread's first events carry their run and role: more than the one statement, so a transaction
    # of its own; a failure in its last statement leaves none of the earlier ones behind.
    t = Thread()
    plan = await _plan_from_db(db, [t.system("You fix bugs."), t.user("first")])
    assert not one_statement(plan)  # type: ignore[arg-type]

    def crash() -> None:
        raise RuntimeError("the process died before its commit")

    with pytest.raises(RuntimeError):
        await write_plan(db, plan, recorded_by="a", keep_raw=1024, before_commit=crash)  # type: ignore[arg-type]
    assert await store_heads.select_head(db, t.thread_id) is None
    assert await db.fetchval("SELECT count(*) FROM ctx.runs WHERE run_id = $1", t.run_id) == 0
    await write_plan(db, plan, recorded_by="a", keep_raw=1024)  # type: ignore[arg-type]
    assert await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id = $1", t.thread_id) == 2
