"""Content stored by many sessions at once (the same file read in each) is stored once, and no batch
waits for another's transaction to store it (a blob inserted inside a batch's transaction would
stay locked until its commit, and every other batch with the same content would wait, holding one
of the pool's connections)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from contracts import DeadLetter
from services.app.recording import RecordingService
from services.core.ledger import RecordingLimits
from services.store import batches
from services.store.connect import create_pool
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread, incoming

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

# Over RecordingLimits.blob_min_bytes: stored once under its hash, the records pointing at it.
SHARED = "\n".join(f"line {i}: the same build log, read in every session" for i in range(200))


class _Sink:
    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        raise AssertionError(f"nothing here is dead-lettered: {letter.code}")


async def test_a_batch_storing_content_an_open_batch_stores_too_is_not_held_up_by_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = await create_pool(database_url, min_size=2, max_size=4)
    store = PgStore(pool)
    limits = RecordingLimits()
    assert len(SHARED.encode()) >= limits.blob_min_bytes
    a, b = Thread(), Thread()
    # A new session's first batch: a transaction (a new run, a blob), not one statement.
    batch_a = incoming([a.user(SHARED, key="k1")])
    batch_b = incoming([b.user(SHARED, key="k1")])
    a_open, a_may_commit = asyncio.Event(), asyncio.Event()
    write_ledger = batches.write_ledger

    async def pausing(conn: Any, plan: Any, *args: Any) -> Any:
        # Inside A's transaction, after whatever it wrote before its records.
        if any(r.thread_id == a.thread_id for r in plan.records):
            a_open.set()
            await a_may_commit.wait()
        return await write_ledger(conn, plan, *args)

    monkeypatch.setattr(batches, "write_ledger", pausing)

    def service() -> RecordingService:
        return RecordingService(
            store, _Sink(), limits=limits, recorder_id="blobs", consumer=f"blobs-{uuid.uuid4().hex}"
        )

    try:
        recording_a = asyncio.create_task(service().record_batch(0, batch_a))
        await asyncio.wait_for(a_open.wait(), 10)
        # A's transaction is open; B stores the same content meanwhile.
        result_b = await asyncio.wait_for(service().record_batch(0, batch_b), 10)
        a_may_commit.set()
        result_a = await asyncio.wait_for(recording_a, 10)
        assert (result_a.recorded, result_b.recorded) == (1, 1)
        async with pool.acquire() as conn:
            stored = await conn.fetch(
                "SELECT r.thread_id, r.blob_sha256, length(bl.content) AS size FROM ctx.records r"
                " JOIN ctx.blobs bl ON bl.sha256 = r.blob_sha256 WHERE r.thread_id = ANY($1::text[])",
                [a.thread_id, b.thread_id],
            )
        assert {r["thread_id"] for r in stored} == {a.thread_id, b.thread_id}
        assert len({r["blob_sha256"] for r in stored}) == 1
        assert {r["size"] for r in stored} == {len(SHARED.encode())}
    finally:
        a_may_commit.set()
        await pool.close()
