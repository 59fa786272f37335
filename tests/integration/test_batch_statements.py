"""How many SQL statements the recorder spends on a batch: each is a round trip, and the ingest rate
of a partition is bounded by them.

Counted through asyncpg's query logger on every connection of the store's pool, so anything the
recording path sends — reads, writes, tracking, BEGIN and COMMIT — is seen.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest

from contracts import DeadLetter
from services.app.recording import RecordingService
from services.app.views import ViewLoader
from services.core.ledger import BatchPlan, LedgerReads, RecordingLimits, decode_batch, plan_batch
from services.core.tokens import ENCODINGS, counter_for
from services.store.batch_write import Position, write_ledger
from services.store.connect import create_pool
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread, incoming

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


class _Sink:
    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        raise AssertionError(f"nothing here is dead-lettered: {letter.code}")


class _Statements:
    def __init__(self) -> None:
        self.queries: list[str] = []

    def __call__(self, record: asyncpg.connection.LoggedQuery) -> None:
        self.queries.append(" ".join(record.query.split())[:60])


@pytest.fixture
async def counted(database_url: str) -> AsyncIterator[tuple[RecordingService, _Statements]]:
    statements = _Statements()

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(statements)

    # The fleet's own pool settings (services.store.connect), so its release costs are counted too.
    pool = await create_pool(database_url, min_size=1, max_size=1, init=init)
    # A consumer of its own: its positions start at 0 whatever other tests recorded.
    service = RecordingService(
        PgStore(pool),
        _Sink(),
        limits=RecordingLimits(),
        recorder_id="count",
        consumer=f"count-{uuid.uuid4().hex}",
    )
    yield service, statements
    await pool.close()


async def _statements_of(
    service: RecordingService, statements: _Statements, events: list, seq: int
) -> list[str]:  # type: ignore[type-arg]
    statements.queries.clear()
    batch = incoming(events, start_seq=seq)
    result = await service.record_batch(partition=0, batch=batch)
    assert result.recorded == len(events)
    return list(statements.queries)


async def test_one_event_on_a_known_thread_costs_two_statements(
    counted: tuple[RecordingService, _Statements],
) -> None:
    service, statements = counted
    seqs = itertools.count(1, 1_000)
    t = Thread()
    await _statements_of(service, statements, [t.user("first")], seq=next(seqs))
    sent = await _statements_of(service, statements, [t.user("second", key="k2")], seq=next(seqs))
    # The one read (the partition's position with it) and the one write (session bump, head
    # compare-and-set, records and position: services/store/batch_write.py), which commits by itself:
    # no BEGIN, no COMMIT.
    assert len(sent) == 2, "\n".join(sent)
    assert not any(q.startswith(("BEGIN", "COMMIT")) for q in sent), "\n".join(sent)


async def test_a_batch_of_many_threads_and_sessions_costs_a_fixed_number_of_statements(
    counted: tuple[RecordingService, _Statements],
) -> None:
    service, statements = counted
    seqs = itertools.count(1, 1_000)
    threads = [Thread() for _ in range(20)]
    await _statements_of(service, statements, [t.user("first") for t in threads], seq=next(seqs))
    events = []
    for t in threads:
        call = t.assistant("looking", calls=(("c1", "ls", {"path": "."}),))
        events += [call, t.outcome("c1", "a\nb\n" * 50)]
    sent = await _statements_of(service, statements, events, seq=next(seqs))
    # As above — the tool calls inserted and closed and the receipts settled are sub-statements of the
    # one write (each call with the outcome the same batch gives it): nothing grows with the threads,
    # sessions or events of the batch.
    assert len(sent) == 2, "\n".join(sent)


async def test_a_batch_with_more_than_the_ledger_to_write_runs_in_one_transaction(
    counted: tuple[RecordingService, _Statements],
) -> None:
    service, statements = counted
    t = Thread()
    # A thread's first event also records its run (and its role): statements of their own, so the
    # batch is a transaction around them.
    sent = await _statements_of(service, statements, [t.system("You fix bugs."), t.user("first")], seq=1)
    assert sent[1].startswith("BEGIN") and sent[-1].startswith("COMMIT"), "\n".join(sent)


async def test_a_view_load_after_a_new_record_costs_one_statement(
    counted: tuple[RecordingService, _Statements], database_url: str
) -> None:
    # The read-your-writes step's view load: the head, scope, view state, window, facts and the record
    # just committed all come in the head's statement (services/store/thread_at_head.py).
    service, statements = counted
    seqs = itertools.count(1, 1_000)
    t = Thread()
    await _statements_of(
        service,
        statements,
        [t.system("You fix bugs.", key="s1"), t.user("first", key="u1"), t.user("more", key="u2")],
        seq=next(seqs),
    )
    loader = ViewLoader()
    pool = await create_pool(database_url, min_size=1, max_size=1, init=_logging(statements))
    try:
        store = PgStore(pool)
        async with store.connection() as s:
            await loader.load(s, t.thread_id)  # warm: the session's pinned policy, the records so far
        await _statements_of(service, statements, [t.user("and this", key="u3")], seq=next(seqs))
        statements.queries.clear()
        async with store.connection() as s:
            view = await loader.load(s, t.thread_id)
        assert [r.event_key for r in view.records][-1] == "u3"
        assert len(statements.queries) == 1, "\n".join(statements.queries)
    finally:
        await pool.close()


def _logging(statements: _Statements) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(statements)

    return init


async def test_records_written_in_one_json_argument_read_back_as_they_were_planned(
    counted: tuple[RecordingService, _Statements], database_url: str
) -> None:
    # The records travel as one JSON array (services/store/batch_write.py): text of any kind, a payload
    # kept as its own JSON text, times at any offset, and the fields a record leaves empty.
    service, _ = counted
    t = Thread()
    aware = datetime(2026, 12, 3, 21, 0, 0, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    utc = datetime(2026, 12, 3, 21, 0, 0, 654321, tzinfo=timezone.utc)
    odd = 'quote " backslash \\ tab \t newline \n é 漢字 🎉 \u2028 control \x01'
    events = [
        t.user(odd).model_copy(update={"client_ts": aware}),
        t.assistant("calling", calls=(("c1", "grep", {"pattern": odd, "n": 3}),)).model_copy(
            update={"client_ts": utc}
        ),
        t.outcome("c1", "line\n" * 4_000),  # long: trimmed, masked, its text in a blob
    ]
    plan = plan_batch(
        decode_batch(incoming(events), RecordingLimits()),
        LedgerReads({}, {}, {}),
        RecordingLimits(),
        {n: counter_for(n) for n in ENCODINGS},
    )
    result = await service.record_batch(partition=0, batch=incoming(events, start_seq=9_000))
    assert result.recorded == 3
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT seq, payload::text AS payload, text, blob_sha256, view_text, tokens_o200k, client_ts,"
            " mask_text, mask_tokens_o200k, content_sha256, record_hash FROM ctx.records"
            " WHERE thread_id = $1 ORDER BY seq",
            t.thread_id,
        )
    finally:
        await conn.close()
    assert [r["seq"] for r in rows] == [p.seq for p in plan.records]
    for row, planned in zip(rows, plan.records, strict=True):
        assert row["payload"] == planned.payload_json
        assert (row["text"], row["blob_sha256"], row["view_text"]) == (
            planned.text,
            planned.blob_sha256,
            planned.view_text,
        )
        assert (row["mask_text"], row["mask_tokens_o200k"]) == (
            planned.mask_text,
            planned.mask_tokens.o200k_base if planned.mask_tokens else None,
        )
        assert row["tokens_o200k"] == planned.tokens.o200k_base
        assert (row["content_sha256"], row["record_hash"]) == (planned.content_sha256, planned.record_hash)
    assert rows[0]["text"] == odd
    # The same instants, whatever offset the runtime wrote them at (the wire requires one).
    assert rows[0]["client_ts"] == aware
    assert rows[1]["client_ts"] == utc
    assert rows[2]["client_ts"] is None and rows[2]["blob_sha256"] is not None


def _plan_of_new_thread(text: str) -> BatchPlan:
    """The plan of one user message opening a thread of its own."""
    return plan_batch(
        decode_batch(incoming([Thread().user(text, key="k1")]), RecordingLimits()),
        LedgerReads({}, {}, {}),
        RecordingLimits(),
        {n: counter_for(n) for n in ENCODINGS},
    )


async def test_a_recorder_write_commits_without_waiting_for_the_wal_flush_and_leaves_the_connection_as_it_was(
    database_url: str,
) -> None:
    # The recorder's events are durable in the broker before it reads them, so its commit need
    # not wait for the WAL flush; a write with no position (not read from the stream) still waits.
    plan = _plan_of_new_thread("first")
    consumer = f"flush-{uuid.uuid4().hex}"
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            await write_ledger(conn, plan, "unit", Position(consumer, 0, 1))
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
        unpositioned = _plan_of_new_thread("second")
        async with conn.transaction():
            await write_ledger(conn, unpositioned, "unit", None)
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await conn.close()


async def test_a_recorder_write_that_commits_by_itself_leaves_no_setting_on_the_pooled_connection(
    database_url: str,
) -> None:
    sent: list[str] = []

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: sent.append(record.query))

    pool = await create_pool(database_url, min_size=1, max_size=1, init=init)
    try:
        service = RecordingService(
            PgStore(pool),
            _Sink(),
            limits=RecordingLimits(),
            recorder_id="flush",
            consumer=f"flush-{uuid.uuid4().hex}",
        )
        t = Thread()
        await service.record_batch(0, incoming([t.user("first", key="k1")]))
        sent.clear()
        result = await service.record_batch(0, incoming([t.user("second", key="k2")], start_seq=2))

        assert result.recorded == 1
        (write,) = [q for q in sent if "INSERT" in q]
        assert "set_config('synchronous_commit', 'off', true)" in write
        async with pool.acquire() as conn:  # the pool's one connection, the write's own
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await pool.close()
