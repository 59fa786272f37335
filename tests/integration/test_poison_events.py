"""No input stops a recorder partition: poison events are dead-lettered, everything around them is recorded.

Two layers are exercised. The wire's decode limits turn six tiny hostile events (each once retried
for ever) into dead letters with their code; the recorder's safety net sets aside any event that
still cannot be applied — one PostgreSQL refuses, or one the store path is made to fail on — and
records the rest of its batch in order, exactly once, while transient failures are still retried.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import nats
import pytest

import services.app.recording as recording
from contracts import DeadLetter
from contracts.subjects import DEAD_STREAM, dead_subject, partition_of
from ctxfleet_client.client import FleetClient
from contracts.exceptions import DuplicateEvent, StoreUnavailable
from services.core.hashing import verify_chain
from services.core.ledger import BatchPlan, Incoming, RecordingLimits
from services.core.ledger import plan_steps as real_plan_steps
from services.app.recording import RecordingService
from services.store import ledger as store_records
from services.store.batch_write import LedgerWritten
from services.store.batches import write_plan as real_write_plan
import services.store.batches as store_ledger
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread, incoming
from tests.fixtures.fleet import TEST_PARTITIONS, eventually
from workers.metrics import FleetMetrics
from workers.recorder import RecorderWorker

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


def _envelope(t: Thread, key: str) -> str:
    """The envelope fields of ``t`` as JSON object members, to splice into hand-written bodies."""
    body = {"event_key": key, "session_id": t.session_id, "run_id": t.run_id, "instance_id": t.instance_id}
    return json.dumps(body)[1:-1]


def _tool_args(t: Thread, key: str, value_json: str) -> bytes:
    call = '{"call_id":"c-%s","name":"ls","args":{"a":%s}}' % (key, value_json)
    return (
        '{"kind":"assistant_message",%s,"payload":{"tool_calls":[%s]}}' % (_envelope(t, key), call)
    ).encode()


def _user_text(t: Thread, key: str, text_json: str) -> bytes:
    return ('{"kind":"user_input",%s,"payload":{"text":%s}}' % (_envelope(t, key), text_json)).encode()


# The six ~20-byte payloads that once stalled a partition for ever, with the code each now gets.
POISONS: list[tuple[str, str, Any]] = [
    ("nul", "invalid_encoding", lambda t, k: _user_text(t, k, '"a\\u0000b"')),
    ("lone-surrogate", "invalid_encoding", lambda t, k: _user_text(t, k, '"a\\ud800b"')),
    ("depth-1000", "invalid_event", lambda t, k: _tool_args(t, k, "[" * 1000 + "]" * 1000)),
    ("int-5000-digits", "invalid_event", lambda t, k: _tool_args(t, k, "9" * 5000)),
    ("1e999", "invalid_event", lambda t, k: _tool_args(t, k, "1e999")),
    ("nan", "invalid_event", lambda t, k: _tool_args(t, k, "NaN")),
]


def _neighbour_of(session_id: str) -> Thread:
    """A thread of another session that the events stream routes to the same partition."""
    target = partition_of(session_id, partitions=TEST_PARTITIONS)
    for i in range(1000):
        candidate = f"s-nb{i}-{uuid.uuid4().hex[:6]}"
        if candidate != session_id and partition_of(candidate, partitions=TEST_PARTITIONS) == target:
            return Thread(session_id=candidate)
    raise AssertionError("no neighbour session found")


async def _keys(db: asyncpg.Connection, thread_id: str) -> list[str]:
    rows = await db.fetch("SELECT event_key FROM ctx.records WHERE thread_id=$1 ORDER BY seq", thread_id)
    return [r["event_key"] for r in rows]


async def test_each_poison_is_dead_lettered_and_its_partition_keeps_recording_both_sessions(
    fleet: object, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    neighbour = _neighbour_of(t.session_id)
    for i, (name, _, build) in enumerate(POISONS):
        await client.append_raw(
            t.thread_id, f"poison-{name}", build(t, f"poison-{name}"), session_id=t.session_id
        )
        await client.append(t.user(f"canary after {name}", key=f"canary-{i}"))
        await client.append(neighbour.user(f"neighbour canary after {name}", key=f"nb-{i}"))

    async def all_canaries() -> bool:
        return len(await _keys(db, t.thread_id)) == len(POISONS) and len(
            await _keys(db, neighbour.thread_id)
        ) == len(POISONS)

    await eventually(all_canaries, timeout=20, what="every canary of both sessions")
    assert await _keys(db, t.thread_id) == [f"canary-{i}" for i in range(len(POISONS))]
    assert await _keys(db, neighbour.thread_id) == [f"nb-{i}" for i in range(len(POISONS))]
    rows = await db.fetch(
        "SELECT code, reason, details::text AS details FROM ctx.dead_letters WHERE thread_id=$1 "
        "ORDER BY stream_seq",
        t.thread_id,
    )
    assert [r["code"] for r in rows] == [code for _, code, _ in POISONS]
    for row in rows:
        assert '"limit"' in row["details"] and row["reason"]


class _Sink:
    """Collects dead letters as the JetStream sink would publish them (idempotent by msg id)."""

    def __init__(self) -> None:
        self.letters: dict[str, DeadLetter] = {}

    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        self.letters.setdefault(msg_id, letter)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    yield p
    await p.close()


def _service(pool: asyncpg.Pool, sink: _Sink) -> RecordingService:
    return RecordingService(PgStore(pool), sink, limits=RecordingLimits(), recorder_id="poison-test")


def _fail_write_for(key: str, error: Exception, times: int | None = None) -> Any:
    """A ``write_plan`` that raises ``error`` whenever the plan records ``key`` (``times`` at most)."""
    real = real_write_plan
    calls = {"failed": 0}

    async def write_plan(conn: Any, plan: BatchPlan, **kw: Any) -> LedgerWritten:
        if any(r.event_key == key for r in plan.records) and (times is None or calls["failed"] < times):
            calls["failed"] += 1
            raise error
        return await real(conn, plan, **kw)

    write_plan.calls = calls  # type: ignore[attr-defined]
    return write_plan


def _mixed_batch(t: Thread, n: Thread, poison_key: str) -> list[Incoming]:
    """Two sessions of one partition interleaved, with the poison in the middle of ``t``."""
    events = [
        t.user("q1", key="t1"),
        n.user("n q1", key="n1"),
        t.assistant("a1", key="t2"),
        t.user("poisoned", key=poison_key),
        n.assistant("n a1", key="n2"),
        t.user("q2", key="t4"),
        t.assistant("a2", key="t5"),
        n.user("n q2", key="n3"),
    ]
    return incoming(events)


async def _position(db: asyncpg.Connection) -> int:
    return int(
        await db.fetchval(
            "SELECT last_stream_seq FROM ctx.tracking WHERE consumer='recorder' AND partition=0"
        )
        or 0
    )


async def test_record_batch_sets_aside_the_one_event_the_store_refuses_and_records_the_rest_once_in_order(
    pool: asyncpg.Pool, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, n = Thread(), Thread()
    batch = _mixed_batch(t, n, "t3")
    refused = asyncpg.exceptions.DataError(
        "invalid input for query argument $9: the store refuses this value"
    )
    monkeypatch.setattr(store_ledger, "write_plan", _fail_write_for("t3", refused))
    sink = _Sink()

    result = await _service(pool, sink).record_batch(0, batch)

    assert await _keys(db, t.thread_id) == ["t1", "t2", "t4", "t5"]
    assert await _keys(db, n.thread_id) == ["n1", "n2", "n3"]
    links = await store_records.select_links(db, t.thread_id)
    assert [link.seq for link in links] == [1, 2, 3, 4] and verify_chain(t.thread_id, links) is None
    assert (result.recorded, [r.code.value for r in result.rejections]) == (7, ["unstorable_event"])
    row = await db.fetchrow("SELECT code, event_key, stream_seq, reason, details FROM ctx.dead_letters")
    assert row is not None
    assert (row["code"], row["event_key"], row["stream_seq"]) == (
        "unstorable_event",
        "t3",
        batch[3].stream_seq,
    )
    assert json.loads(row["details"]) == {"stage": "write", "error": "DataError", "sqlstate": "22000"}
    assert "DataError" in row["reason"]
    (letter,) = sink.letters.values()
    assert (letter.code.value, letter.event_key, letter.thread_id) == ("unstorable_event", "t3", t.thread_id)
    assert await _position(db) == batch[-1].stream_seq

    again = await _service(pool, sink).record_batch(0, batch)
    assert (again.recorded, again.rejections, again.skipped) == (0, (), len(batch))
    assert int(await db.fetchval("SELECT count(*) FROM ctx.records")) == 7
    assert int(await db.fetchval("SELECT count(*) FROM ctx.dead_letters")) == 1


async def test_record_batch_sets_aside_an_event_whose_planning_raises(
    pool: asyncpg.Pool, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, n = Thread(), Thread()
    batch = _mixed_batch(t, n, "t3")
    real = real_plan_steps

    def plan_steps(decoded: Any, *args: Any) -> Generator[None, None, BatchPlan]:
        # Raised on the first step, as a planner bug one event trips would be.
        if any(getattr(d, "event", None) is not None and d.event.event_key == "t3" for d in decoded):
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return (yield from real(decoded, *args))

    monkeypatch.setattr(recording, "plan_steps", plan_steps)
    result = await _service(pool, _Sink()).record_batch(0, batch)

    assert await _keys(db, t.thread_id) == ["t1", "t2", "t4", "t5"]
    assert await _keys(db, n.thread_id) == ["n1", "n2", "n3"]
    assert [(r.code.value, r.event_key, r.details["stage"]) for r in result.rejections] == [
        ("unstorable_event", "t3", "plan")
    ]
    assert await _position(db) == batch[-1].stream_seq


async def test_record_batch_dead_letters_a_timestamp_that_does_not_exist_in_utc_and_records_the_rest(
    pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    # Year 1 at +01:00 is a valid ISO timestamp, but its UTC instant is in year 0, which asyncpg
    # cannot encode: once a poison of its own (found by the store fuzz test), now a decode limit.
    t, n = Thread(), Thread()
    body = json.loads(t.user("from before the epoch of datetimes", key="t3").model_dump_json())
    body["client_ts"] = "0001-01-01T00:00:00+01:00"
    batch = _mixed_batch(t, n, "t3")
    batch[3] = Incoming(batch[3].subject, json.dumps(body).encode(), batch[3].stream_seq)

    result = await _service(pool, _Sink()).record_batch(0, batch)

    assert await _keys(db, t.thread_id) == ["t1", "t2", "t4", "t5"]
    assert await _keys(db, n.thread_id) == ["n1", "n2", "n3"]
    (rejection,) = result.rejections
    assert (rejection.code.value, rejection.details["limit"]) == ("invalid_event", "client_ts_range")


@pytest.mark.parametrize(
    "transient",
    [
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.UndefinedTableError('relation "ctx.records" does not exist'),
        asyncpg.exceptions.DiskFullError("could not extend file: No space left on device"),
    ],
    ids=["connection-lost", "missing-table", "disk-full"],
)
async def test_record_batch_propagates_a_store_failure_and_dead_letters_nothing_then_records_all_on_retry(
    pool: asyncpg.Pool, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch, transient: Exception
) -> None:
    # A failure of the store, not of an event, would hit any event alike: blaming one would
    # turn valid events into dead letters, so it propagates for the worker to retry.
    t, n = Thread(), Thread()
    batch = _mixed_batch(t, n, "t3")
    monkeypatch.setattr(store_ledger, "write_plan", _fail_write_for("t3", transient, times=1))
    sink = _Sink()

    with pytest.raises((StoreUnavailable, type(transient))):
        await _service(pool, sink).record_batch(0, batch)
    assert int(await db.fetchval("SELECT count(*) FROM ctx.records")) == 0
    assert int(await db.fetchval("SELECT count(*) FROM ctx.dead_letters")) == 0 and not sink.letters
    assert await _position(db) == 0

    result = await _service(pool, sink).record_batch(0, batch)
    assert (result.recorded, result.rejections) == (8, ())
    assert await _keys(db, t.thread_id) == ["t1", "t2", "t3", "t4", "t5"]
    assert await _position(db) == batch[-1].stream_seq


async def test_recorder_worker_sets_aside_an_event_the_store_refuses_and_records_later_events(
    start_fleet: Any, client: FleetClient, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = asyncpg.exceptions.CharacterNotInRepertoireError(
        'invalid byte sequence for encoding "UTF8": 0x00'
    )
    monkeypatch.setattr(store_ledger, "write_plan", _fail_write_for("t-bad", refused))
    await start_fleet()
    t = Thread()
    neighbour = _neighbour_of(t.session_id)
    await client.append(t.user("before", key="t-1"))
    await client.append(t.user("refused by the store", key="t-bad"))
    await client.append(neighbour.user("neighbour", key="nb-1"))
    await client.append(t.user("after", key="t-2"))

    async def recorded() -> bool:
        return await _keys(db, t.thread_id) == ["t-1", "t-2"] and await _keys(db, neighbour.thread_id) == [
            "nb-1"
        ]

    await eventually(recorded, timeout=20, what="the events around the refused one")
    row = await db.fetchrow("SELECT code, event_key, details FROM ctx.dead_letters")
    assert row is not None
    assert (row["code"], row["event_key"]) == ("unstorable_event", "t-bad")
    assert json.loads(row["details"])["sqlstate"] == "22021"


class _FailingPgWrites(PgStore):
    """The fleet's store, except that every write recording ``key`` raises ``error``."""

    def __init__(self, pool: asyncpg.Pool, key: str, error: Exception) -> None:
        super().__init__(pool)
        self.key = key
        self.error = error

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        async with super().connection() as inner:
            yield _FailingPgConnection(inner, self)


class _FailingPgConnection:
    def __init__(self, inner: Any, owner: _FailingPgWrites) -> None:
        self._inner = inner
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def write_plan(self, plan: BatchPlan, **kw: Any) -> LedgerWritten:
        if any(r.event_key == self._owner.key for r in plan.records):
            raise self._owner.error
        return await self._inner.write_plan(plan, **kw)


@pytest.mark.parametrize(
    "unforeseen",
    [RuntimeError("a bug one event trips"), DuplicateEvent("t-bad")],
    ids=["bug", "stored-key-the-reads-miss"],
)
async def test_recorder_worker_sets_aside_an_event_whose_write_always_fails_once_said_once_and_counted(
    streams: str,
    database_url: str,
    client: FleetClient,
    db: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
    unforeseen: Exception,
) -> None:
    caplog.set_level(logging.INFO, logger="ctxfleet.recorder")
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    nc = await nats.connect(streams)
    metrics = FleetMetrics()
    worker = RecorderWorker(
        nc,
        _FailingPgWrites(pool, "t-bad", unforeseen),
        metrics,
        partitions=range(TEST_PARTITIONS),
        limits=RecordingLimits(),
        recorder_id="unforeseen-test",
        batch=256,
    )
    await worker.start()
    try:
        t = Thread()
        neighbour = _neighbour_of(t.session_id)
        await client.append(t.user("before", key="t-1"))
        bad = await client.append(t.user("its write always fails", key="t-bad"))
        await client.append(neighbour.user("neighbour", key="nb-1"))
        await client.append(t.user("after", key="t-2"))

        async def recorded() -> bool:
            return await _keys(db, t.thread_id) == ["t-1", "t-2"] and await _keys(
                db, neighbour.thread_id
            ) == ["nb-1"]

        await eventually(recorded, timeout=20, what="the events around the one whose write fails")
        rows = await db.fetch("SELECT code, event_key, stream_seq, details FROM ctx.dead_letters")
        assert [(r["code"], r["event_key"], r["stream_seq"]) for r in rows] == [
            ("unstorable_event", "t-bad", bad.stream_seq)
        ]
        assert json.loads(rows[0]["details"])["error"] == type(unforeseen).__name__
        stored = await nc.jetstream().get_last_msg(DEAD_STREAM, dead_subject(t.thread_id))
        letter = DeadLetter.model_validate_json(stored.data)
        assert (letter.code.value, letter.event_key, letter.raw_truncated) == (
            "unstorable_event",
            "t-bad",
            False,
        )
        assert json.loads(base64.b64decode(letter.raw_base64))["payload"]["text"] == "its write always fails"
        assert (
            metrics.registry.get_sample_value("ctx_recorder_events_unstorable_total", {"stage": "write"}) == 1
        )
    finally:
        await worker.stop()
        await nc.close()
        await pool.close()
    said = [r.getMessage() for r in caplog.records if r.name == "ctxfleet.recorder"]
    assert len([m for m in said if "set aside" in m]) == 1, said
    assert not [m for m in said if "retrying" in m], said
