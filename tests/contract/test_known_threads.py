"""An agent's next step on a thread the recorder just wrote is planned from what it wrote, without
reading the ledger — and commits exactly what a step planned from a read commits.

Each test runs on the in-memory twin and on PostgreSQL (the statement's guards: the head's
compare-and-set, the unique keys and call ids, ``ctx.require_position``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from services.app.recording import BatchResult, RecordingService
from services.core.ledger import RecordingLimits
from services.errors import PositionRegressed
from services.store.memory import MemoryStore
from tests.contract.test_store_parity import _observe, _streams
from tests.fixtures.builders import LetterSink, Thread, incoming

pytestmark = pytest.mark.anyio


class _CountingReads:
    """The store, counting the batch reads its sessions make."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads = 0

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        async with self.inner.session() as s:
            yield _Session(s, self)


class _Session:
    def __init__(self, inner: Any, counter: _CountingReads) -> None:
        self._inner, self._counter = inner, counter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def read_for_batch(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.reads += 1
        return await self._inner.read_for_batch(*args, **kwargs)


def _service(
    store: Any, *, known_threads: int = 4096, recorder_id: str = "known", sink: LetterSink | None = None
) -> RecordingService:
    return RecordingService(
        store,
        sink or LetterSink(),
        limits=RecordingLimits(),
        recorder_id=recorder_id,
        known_threads=known_threads,
    )


async def _one_by_one(service: RecordingService, events: list[Any], start: int) -> list[BatchResult]:
    """Each event its own batch, as an agent's steps arrive; ``committed`` as the worker passes it."""
    results = []
    for message in incoming(events, start_seq=start):
        results.append(await service.record_batch(0, [message], committed=message.stream_seq - 1))
    return results


async def test_a_known_threads_next_steps_are_recorded_without_reading_the_ledger(store: Any) -> None:
    counted = _CountingReads(store)
    service = _service(counted)
    t = Thread()
    events = [
        t.system("You fix bugs.", key="s"),
        t.user("Fix app.py", key="u"),
        t.assistant("looking", calls=(("c1", "ls", {"path": "."}),), key="a1"),
        t.outcome("c1", "app.py\n", key="o1"),
        t.assistant("reading", calls=(("c2", "cat", {"path": "app.py"}),), key="a2"),
        t.outcome("c2", "import missing\n", key="o2"),
    ]
    results = await _one_by_one(service, events, start=1)
    # The thread's first event creates its run, the second is read (nothing known yet of a new thread's
    # run), and every later step is planned from what the recorder wrote.
    assert [r.known for r in results] == ["none", "none", "planned", "planned", "planned", "planned"]
    assert counted.reads == 2
    assert all(r.recorded == 1 for r in results)


async def test_steps_planned_from_what_was_written_commit_what_steps_planned_from_reads_commit(
    store: Any,
) -> None:
    # Real traces and a hand-built session (children, exports, an orphan outcome, a redelivered key,
    # run ends, a reset, a new run), one event per batch: recorded with the knowledge into the store
    # under test and without it into the in-memory twin, everything a view can read is the same.
    read_every_time = MemoryStore()
    known, reading = _service(store), _service(read_every_time, known_threads=0)
    start, used = 1, []
    streams = _streams()
    for events in streams:
        used += await _one_by_one(known, events, start)
        await _one_by_one(reading, events, start)
        start += len(events)
    thread_ids = sorted({e.thread_id for events in streams for e in events})
    session_ids = sorted({e.session_id for events in streams for e in events})
    assert await _observe(store, thread_ids, session_ids) == await _observe(
        read_every_time, thread_ids, session_ids
    )
    planned = sum(r.known == "planned" for r in used)
    assert planned > len(used) // 2, f"{planned} of {len(used)} batches planned from what was known"
    # The orphan outcome and the redelivered key were planned from what was known, then read.
    assert sum(r.known == "missed" for r in used) >= 2


async def test_a_redelivered_key_is_found_by_the_write_and_read_as_a_duplicate(store: Any) -> None:
    service = _service(store)
    t = Thread()
    await _one_by_one(service, [t.user("Fix app.py", key="u1"), t.assistant("ok", key="a1")], start=1)
    # A client re-publishing its step: a new stream message, a key already recorded.
    [again] = await _one_by_one(service, [t.assistant("ok", key="a1")], start=3)
    assert (again.known, again.recorded, again.duplicates) == ("missed", 0, 1)
    [next_step] = await _one_by_one(service, [t.user("and the tests", key="u2")], start=4)
    assert (next_step.known, next_step.recorded) == ("none", 1)  # read after the miss, then known again
    [after] = await _one_by_one(service, [t.assistant("on it", key="a2")], start=5)
    assert after.known == "planned"


async def test_a_head_another_recorder_moved_makes_the_step_read_and_plan_again(store: Any) -> None:
    ours, theirs = _service(store, recorder_id="ours"), _service(store, recorder_id="theirs")
    t = Thread()
    await _one_by_one(ours, [t.user("Fix app.py", key="u1"), t.assistant("ok", key="a1")], start=1)
    # The partition changed hands and back: the other recorder wrote a step of this thread meanwhile.
    await _one_by_one(theirs, [t.user("also the docs", key="u2")], start=3)
    [step] = await _one_by_one(ours, [t.assistant("both then", key="a2")], start=4)
    assert (step.known, step.recorded) == ("missed", 1)
    async with store.session() as s:
        head = await s.select_head(t.thread_id)
    assert head is not None and head.last_seq == 4


async def test_an_outcome_of_a_call_closed_meanwhile_is_dead_lettered_once(store: Any) -> None:
    sink = LetterSink()
    service = _service(store, sink=sink)
    t = Thread()
    events = [
        t.user("Fix app.py", key="u1"),
        t.assistant("looking", calls=(("c1", "ls", {}),), key="a1"),
        t.outcome("c1", "app.py", key="o1"),
        t.outcome("c1", "app.py again", key="o1-again"),
    ]
    results = await _one_by_one(service, events, start=1)
    # What was known rejects it (c1 is forgotten once closed); the read decides why, once.
    assert (results[-1].known, results[-1].recorded, len(results[-1].rejections)) == ("missed", 0, 1)
    assert [letter.event_key for letter in sink.letters] == ["o1-again"]


async def test_a_call_id_stored_before_what_is_known_is_dead_lettered_by_the_read(store: Any) -> None:
    sink = LetterSink()
    service = _service(store, sink=sink)
    t = Thread()
    events = [
        t.user("Fix app.py", key="u1"),
        t.assistant("looking", calls=(("c1", "ls", {}),), key="a1"),  # read: c1 is not known after it
        t.assistant("again", calls=(("c1", "ls", {}),), key="a2"),  # the same call id, open
    ]
    results = await _one_by_one(service, events, start=1)
    assert results[1].known == "none"
    assert results[2].known == "missed" and results[2].recorded == 0 and len(results[2].rejections) == 1
    assert [letter.event_key for letter in sink.letters] == ["a2"]


async def test_a_position_behind_what_was_committed_is_refused_without_a_read(store: Any) -> None:
    counted = _CountingReads(store)
    service = _service(counted)
    t = Thread()
    await _one_by_one(service, [t.user("Fix app.py", key="u1"), t.assistant("ok", key="a1")], start=1)
    reads = counted.reads
    # The reader saw stream seq 4 committed, the store holds 2: commits were lost.
    [message] = incoming([t.user("next", key="u2")], start_seq=5)
    with pytest.raises(PositionRegressed):
        await service.record_batch(0, [message], committed=4)
    assert counted.reads == reads  # refused by the write's guard, nothing written
    async with store.session() as s:
        head = await s.select_head(t.thread_id)
    assert head is not None and head.last_seq == 2


async def test_a_batch_the_store_has_applied_already_is_skipped(store: Any) -> None:
    service = _service(store)
    t = Thread()
    await _one_by_one(service, [t.user("Fix app.py", key="u1"), t.assistant("ok", key="a1")], start=1)
    # The same stream message delivered again to a reader that did not see its commit.
    [message] = incoming([t.assistant("ok", key="a1")], start_seq=2)
    result = await service.record_batch(0, [message], committed=1)
    assert (result.known, result.recorded, result.skipped) == ("missed", 0, 1)


async def test_a_long_tool_output_is_stored_as_a_blob_without_a_read(store: Any) -> None:
    counted = _CountingReads(store)
    service = _service(counted)
    t = Thread()
    long_output = "".join(f"line {n}: the build wrote this\n" for n in range(400))  # ~12 KB: a blob
    events = [
        t.user("Fix app.py", key="u1"),
        t.assistant("building", calls=(("c1", "make", {}),), key="a1"),
        t.outcome("c1", long_output, key="o1"),
    ]
    results = await _one_by_one(service, events, start=1)
    # The blob goes first, under its hash, as any batch stores it; nothing a plan reads changes.
    assert results[-1].known == "planned" and counted.reads == 2
    async with store.session() as s:
        full = await s.select_full(t.thread_id)
    assert full[-1][1] == "o1" and full[-1][4] == long_output
