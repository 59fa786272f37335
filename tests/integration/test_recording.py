"""The recorder over real NATS JetStream and PostgreSQL: idempotence, order, storage."""

from __future__ import annotations

import asyncpg
import pytest

from contracts import PrepareRequest
from ctxfleet_client.client import FleetClient, msg_id_of
from services.core.hashing import verify_chain
from services.store import ledger as store_records
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def _count(db: asyncpg.Connection, thread: Thread) -> int:
    return int(await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id = $1", thread.thread_id))


async def test_append_duplicate_publish_is_dropped_by_jetstream_and_recorded_once(
    fleet: Fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    first = await client.append(t.user("hello", key="k1"))
    again = await client.append(t.user("hello", key="k1"))
    assert not first.duplicate and again.duplicate and again.stream_seq == first.stream_seq
    await eventually(lambda: _has(db, t, 1), what="the record")
    assert await _count(db, t) == 1


async def test_append_same_key_under_new_msg_id_is_noop_and_acks(
    fleet: Fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    # Past JetStream's duplicate window a retry is stored again; the recorder must still record it once.
    t = Thread()
    event = t.user("hello", key="k1")
    await client.append(event)
    await client.append_raw(t.thread_id, "retry-after-window", event.model_dump_json().encode())
    marker = t.user("after the duplicate", key="k2")
    await client.append(marker)
    await eventually(lambda: _has(db, t, 2), what="the marker record")
    rows = await db.fetch(
        "SELECT seq, event_key FROM ctx.records WHERE thread_id = $1 ORDER BY seq", t.thread_id
    )
    assert [(r["seq"], r["event_key"]) for r in rows] == [(1, "k1"), (2, "k2")]
    assert await db.fetchval("SELECT count(*) FROM ctx.dead_letters") == 0


async def test_recorder_redelivery_after_lost_position_records_nothing_twice(
    start_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    fleet = await start_fleet()
    for i in range(30):
        await client.append(t.user(f"message {i}", key=f"k{i}"))
    await eventually(lambda: _has(db, t, 30), what="30 records")
    await fleet.stop()
    # Forget every position: the next recorder re-reads the whole stream, as after a crash
    # between commit and a position that was never written.
    await db.execute("DELETE FROM ctx.tracking")
    await client.append(t.user("one more", key="k30"))
    await start_fleet(recorder_id="second-recorder")
    await eventually(lambda: _has(db, t, 31), what="the new record")
    assert await _count(db, t) == 31
    seqs = [
        r["seq"]
        for r in await db.fetch("SELECT seq FROM ctx.records WHERE thread_id=$1 ORDER BY seq", t.thread_id)
    ]
    assert seqs == list(range(1, 32))


async def test_records_keep_publish_order_with_consecutive_seqs_and_a_verified_chain(
    fleet: Fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    main = Thread()
    threads = [main] + [main.child_thread(f"helper{i}") for i in range(4)]  # one session, five writers
    for i in range(20):
        for t in threads:
            await client.append(t.user(f"{t.run_id} #{i}", key=f"k{i}"))
    for t in threads:
        await eventually(lambda t=t: _has(db, t, 20), what=f"20 records of {t.thread_id}")
        rows = await db.fetch(
            "SELECT seq, event_key FROM ctx.records WHERE thread_id=$1 ORDER BY seq", t.thread_id
        )
        assert [r["event_key"] for r in rows] == [f"k{i}" for i in range(20)]
        assert verify_chain(t.thread_id, await store_records.select_links(db, t.thread_id)) is None
    session_seqs = [
        r["session_seq"] for r in await db.fetch("SELECT session_seq FROM ctx.records ORDER BY session_seq")
    ]
    assert session_seqs == list(range(1, 101))


async def test_large_content_is_stored_once_in_blobs_and_referenced(
    fleet: Fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    big = "line of build output\n" * 2000
    await client.append(t.assistant(calls=(("c1", "bash", {"cmd": "make"}), ("c2", "bash", {"cmd": "make"}))))
    await client.append(t.outcome("c1", big))
    await client.append(t.outcome("c2", big))
    await eventually(lambda: _has(db, t, 3), what="3 records")
    assert await db.fetchval("SELECT count(*) FROM ctx.blobs") == 1
    rows = await db.fetch("SELECT blob_sha256, text, view_text FROM ctx.records WHERE kind='tool_outcome'")
    assert len({r["blob_sha256"] for r in rows}) == 1 and all(r["text"] is None for r in rows)
    assert all("ctx://blob/" in r["view_text"] for r in rows)


async def test_ledger_refuses_update_and_delete_of_records(
    fleet: Fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await client.append(t.user("immutable"))
    await eventually(lambda: _has(db, t, 1), what="the record")
    with pytest.raises(asyncpg.exceptions.RaiseError, match="append-only"):
        await db.execute("UPDATE ctx.records SET kind = 'x'")
    with pytest.raises(asyncpg.exceptions.RaiseError, match="append-only"):
        await db.execute("DELETE FROM ctx.records")


async def test_inspect_reports_a_tampered_record_as_a_broken_chain(
    fleet: Fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    for i in range(3):
        await client.append(t.user(f"m{i}"))
    await eventually(lambda: _has(db, t, 3), what="3 records")
    assert (await client.inspect(t.thread_id)).chain_verified
    await db.execute("ALTER TABLE ctx.records DISABLE TRIGGER records_append_only")
    await db.execute(
        "UPDATE ctx.records SET content_sha256 = repeat('0', 64) WHERE thread_id=$1 AND seq=2", t.thread_id
    )
    inspection = await client.inspect(t.thread_id)
    assert not inspection.chain_verified and "seq 2" in (inspection.chain_error or "")


async def test_msg_id_is_scoped_by_thread_so_equal_keys_in_two_threads_both_record(
    fleet: Fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    a, b = Thread(), Thread()
    assert msg_id_of(a.thread_id, "k1", b"same") != msg_id_of(b.thread_id, "k1", b"same")
    await client.append(a.user("in a", key="k1"))
    await client.append(b.user("in b", key="k1"))
    await eventually(lambda: _has(db, a, 1), what="a's record")
    await eventually(lambda: _has(db, b, 1), what="b's record")
    prepared = await client.prepare(
        PrepareRequest(
            session_id=b.session_id,
            run_id=b.run_id,
            instance_id="main",
            budget_tokens=1000,
            after_event_key="k1",
        )
    )
    assert prepared.messages[-1].content == "in b"


async def _has(db: asyncpg.Connection, thread: Thread, n: int) -> bool:
    return await _count(db, thread) >= n
