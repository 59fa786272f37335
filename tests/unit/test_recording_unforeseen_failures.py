"""A failure the recording did not foresee never stops a partition, and an outage never costs an event.

The in-memory store behind a small wrapper whose write fails for one event: what waiting cannot fix
sets that event aside (``unstorable_event``, once, logged once) and records everything around it in
order; what waiting can fix propagates for the worker to retry and dead-letters nothing.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from contracts import DeadLetter, ErrorCode
from services.app.recording import RecordingService
from services.core.ledger import BatchPlan, Incoming, RecordingLimits
from contracts.exceptions import DuplicateEvent, RevisionConflict, StoreUnavailable
from services.store.batch_write import LedgerWritten
from services.store.memory import MemoryConnection, MemoryStore
from tests.fixtures.builders import Thread, incoming

pytestmark = pytest.mark.anyio


class _Sink:
    """Dead letters as the JetStream sink keeps them: one per msg id."""

    def __init__(self, refuses: ErrorCode | None = None) -> None:
        self.letters: dict[str, DeadLetter] = {}
        self.refuses = refuses

    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        if letter.code is self.refuses:
            raise ValueError(f"a sink that cannot take a {letter.code.value} letter")
        self.letters.setdefault(msg_id, letter)


class _FailingWrites:
    """The in-memory store, except that a write recording ``key`` raises ``error`` (``times`` at most)."""

    def __init__(self, store: MemoryStore, key: str, error: Exception, times: int | None = None) -> None:
        self.store = store
        self.key = key
        self.error = error
        self.times = times
        self.failed = 0

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[_FailingConnection]:
        async with self.store.connection() as inner:
            yield _FailingConnection(inner, self)


class _FailingConnection:
    def __init__(self, inner: MemoryConnection, owner: _FailingWrites) -> None:
        self._inner = inner
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def write_plan(self, plan: BatchPlan, **kw: Any) -> LedgerWritten:
        owner = self._owner
        if any(r.event_key == owner.key for r in plan.records) and (
            owner.times is None or owner.failed < owner.times
        ):
            owner.failed += 1
            raise owner.error
        return await self._inner.write_plan(plan, **kw)


def _service(store: Any, sink: _Sink) -> RecordingService:
    return RecordingService(store, sink, limits=RecordingLimits(), recorder_id="unit")


async def _keys(store: MemoryStore, thread_id: str) -> list[str]:
    async with store.connection() as s:
        head = await s.select_head(thread_id)
        records = await s.select_records(thread_id, gt=0, lte=head.last_seq if head else 0)
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    return [r.event_key for r in records]


async def _position(store: MemoryStore) -> int:
    async with store.connection() as s:
        return await s.max_tracking_seq("recorder", 0)


async def _dead_letters(store: MemoryStore, thread_id: str) -> int:
    async with store.connection() as s:
        return await s.count_dead_letters(thread_id)


def _mixed(t: Thread, n: Thread) -> list[Incoming]:
    """Two sessions of one partition interleaved, ``t3`` in the middle of ``t``."""
    return incoming(
        [
            t.user("q1", key="t1"),
            n.user("n q1", key="n1"),
            t.assistant("a1", key="t2"),
            t.user("the one that fails", key="t3"),
            n.assistant("n a1", key="n2"),
            t.user("q2", key="t4"),
            t.assistant("a2", key="t5"),
            n.user("n q2", key="n3"),
        ]
    )


def _said(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ctxfleet.recorder" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "unforeseen",
    [RuntimeError("a bug one event trips"), DuplicateEvent("t3"), KeyError("t3")],
    ids=["bug", "stored-key-the-reads-miss", "key-error"],
)
async def test_record_batch_sets_aside_an_event_whose_write_always_fails_and_records_the_rest_once_in_order(
    caplog: pytest.LogCaptureFixture, unforeseen: Exception
) -> None:
    memory, sink = MemoryStore(), _Sink()
    store = _FailingWrites(memory, "t3", unforeseen)
    t, n = Thread(), Thread()
    batch = _mixed(t, n)

    result = await _service(store, sink).record_batch(0, batch)

    assert await _keys(memory, t.thread_id) == ["t1", "t2", "t4", "t5"]
    assert await _keys(memory, n.thread_id) == ["n1", "n2", "n3"]
    assert result.recorded == 7
    [rejection] = result.rejections
    assert (rejection.code, rejection.event_key, rejection.details["stage"], rejection.details["error"]) == (
        ErrorCode.UNSTORABLE_EVENT,
        "t3",
        "write",
        type(unforeseen).__name__,
    )
    [letter] = sink.letters.values()
    assert (letter.event_key, letter.stream_seq) == ("t3", batch[3].stream_seq)
    assert base64.b64decode(letter.raw_base64) == batch[3].data and not letter.raw_truncated
    assert await _dead_letters(memory, t.thread_id) == 1
    assert await _position(memory) == batch[-1].stream_seq
    [logged] = _said(caplog)
    assert "t3" in logged.getMessage() and "set aside" in logged.getMessage()
    assert logged.exc_info is not None and logged.exc_info[1] is unforeseen

    # Delivered again (a crash before the position reached the broker): nothing twice, nothing said.
    again = await _service(store, sink).record_batch(0, batch)
    assert (again.recorded, again.rejections, again.skipped) == (0, (), len(batch))
    assert await _dead_letters(memory, t.thread_id) == 1 and len(sink.letters) == 1
    assert len(_said(caplog)) == 1


async def test_an_event_whose_write_fails_fewer_times_than_its_attempts_is_recorded_not_set_aside() -> None:
    # An agent's step is a batch of one: its first failure is already the event failing alone.
    memory, sink = MemoryStore(), _Sink()
    t = Thread()
    store = _FailingWrites(memory, "k1", RuntimeError("fails twice, then not"), times=2)

    result = await _service(store, sink).record_batch(0, incoming([t.user("q1", key="k1")]))

    assert (result.recorded, result.rejections) == (1, ())
    assert await _keys(memory, t.thread_id) == ["k1"]
    assert store.failed == 2 and not sink.letters


async def test_a_later_event_of_the_thread_is_planned_as_if_the_set_aside_one_was_never_published() -> None:
    # As after any rejected event: the outcome of a call only the set-aside event made is an orphan,
    # and the thread's next records take the next seqs.
    memory, sink = MemoryStore(), _Sink()
    t = Thread()
    store = _FailingWrites(memory, "a1", RuntimeError("a bug this call trips"))
    batch = incoming(
        [
            t.user("q1", key="u1"),
            t.assistant("", calls=(("c1", "ls", {"path": "."}),), key="a1"),
            t.outcome("c1", "README.md", key="o1"),
            t.user("q2", key="u2"),
        ]
    )

    result = await _service(store, sink).record_batch(0, batch)

    assert await _keys(memory, t.thread_id) == ["u1", "u2"]
    assert [(r.event_key, r.code) for r in result.rejections] == [
        ("a1", ErrorCode.UNSTORABLE_EVENT),
        ("o1", ErrorCode.ORPHAN_TOOL_OUTCOME),
    ]
    assert await _dead_letters(memory, t.thread_id) == 2


async def test_an_event_whose_dead_letter_the_sink_cannot_take_is_set_aside_and_the_rest_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Not the write: publishing the orphan's dead letter fails in a way nothing foresaw.
    memory, sink = MemoryStore(), _Sink(refuses=ErrorCode.ORPHAN_TOOL_OUTCOME)
    t = Thread()
    batch = incoming(
        [t.user("q1", key="u1"), t.outcome("c-none", "orphan", key="o1"), t.user("q2", key="u2")]
    )

    result = await _service(memory, sink).record_batch(0, batch)

    assert await _keys(memory, t.thread_id) == ["u1", "u2"]
    [rejection] = result.rejections
    assert (rejection.event_key, rejection.code, rejection.details["stage"]) == (
        "o1",
        ErrorCode.UNSTORABLE_EVENT,
        "record",
    )
    assert [letter.event_key for letter in sink.letters.values()] == ["o1"]
    assert await _position(memory) == batch[-1].stream_seq
    assert len(_said(caplog)) == 1


@pytest.mark.parametrize(
    "outage",
    [
        StoreUnavailable("ConnectionDoesNotExistError: connection was closed in the middle of operation"),
        RevisionConflict("t", 1, 2),
        ConnectionResetError("a store that forgot to translate its driver's error"),
    ],
    ids=["store-unavailable", "revision-race", "untranslated-os-error"],
)
async def test_a_failure_waiting_can_fix_dead_letters_nothing_and_the_retries_record_everything_once(
    outage: Exception,
) -> None:
    memory, sink = MemoryStore(), _Sink()
    # Longer than one call's own attempts at a revision race, so the worker's retries are needed too.
    store = _FailingWrites(memory, "t3", outage, times=6)
    t, n = Thread(), Thread()
    batch = _mixed(t, n)

    retried = 0
    while True:  # as the worker does, from the position the store holds
        position = await _position(memory)
        try:
            await _service(store, sink).record_batch(0, [m for m in batch if m.stream_seq > position])
            break
        except type(outage):
            retried += 1
            assert retried < 10, "never recorded"

    assert retried >= 1 and store.failed == 6
    assert await _keys(memory, t.thread_id) == ["t1", "t2", "t3", "t4", "t5"]
    assert await _keys(memory, n.thread_id) == ["n1", "n2", "n3"]
    assert not sink.letters
    assert await _dead_letters(memory, t.thread_id) == 0 and await _dead_letters(memory, n.thread_id) == 0
    assert await _position(memory) == batch[-1].stream_seq
