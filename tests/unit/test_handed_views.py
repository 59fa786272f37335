"""A read-your-writes prepare in the process whose recorder committed its event is answered from the
view that process held, extended to the new head with what the batch wrote, and
what it answers is what a load of the ledger would have given. In-memory store, ledger reads counted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contracts import PrepareRequest, PreparedContext
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import BatchResult, RecordingService
from services.app.views import ViewLoader
from services.app.view_trust import ViewTrust
from services.core.ledger import RecordingLimits
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming
from tests.fixtures.ledger_reads import NoDeadLetters, count_view_reads

pytestmark = pytest.mark.anyio


def _request(t: Thread, after: str | None = None) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=8_000,
        after_event_key=after,
        wait_ms=2_000,
    )


class _Process:
    """A recorder and an assembler sharing one loader, wired as ``workers/compose.py`` wires them."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.loader = ViewLoader(trust=ViewTrust(max_age_s=5.0))
        self.loader.trust.listening()
        self.board = NoticeBoard(
            changed=lambda thread_id: self.loader.trust.changed("thread", thread_id),
            moved=self.loader.trust.head_moved,
        )
        self.service = PrepareService(store, self.board, loader=self.loader)
        self._recorder = RecordingService(
            store, NoDeadLetters(), limits=RecordingLimits(), recorder_id="unit"
        )
        self.seq = 1

    async def record(self, events: list[Any]) -> BatchResult:
        """Record a batch and announce it as the recorder worker does: the advances first."""
        result = await self._recorder.record_batch(0, incoming(events, start_seq=self.seq))
        self.seq += len(events)
        for thread_id, head in result.heads.items():
            advance = result.advances.get(thread_id)
            if advance is not None:
                self.loader.extend(advance)
            self.board.recorded(thread_id, *result.committed[thread_id], head)
            self.board.wake(thread_id)  # the recorder lets the batch go
        return result

    async def step(self, t: Thread, events: list[Any]) -> PreparedContext:
        """A prepare naming the batch's last event, waiting when the batch is recorded."""
        waiting = asyncio.create_task(self.service.prepare(_request(t, after=events[-1].event_key)))
        await asyncio.sleep(0)  # it asked the ledger, found nothing yet, and waits for the notice
        await self.record(events)
        return await waiting


async def _loaded(store: MemoryStore, t: Thread) -> PreparedContext:
    """The same context from a process that holds nothing: read from the ledger."""
    return await PrepareService(store, NoticeBoard(), loader=ViewLoader()).prepare(_request(t))


def _same(handed: PreparedContext, loaded: PreparedContext) -> None:
    assert handed.messages == loaded.messages
    assert handed.source_watermark == loaded.source_watermark
    assert handed.budget_report.used == loaded.budget_report.used


async def test_a_step_is_answered_from_the_view_its_own_recorder_extended_as_a_load_would_answer_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process, t = _Process(MemoryStore()), Thread()
    await process.record([t.system("Be brief.", key="sys"), t.user("Fix the failing test.", key="u1")])
    await process.service.prepare(_request(t))  # the view is loaded and held
    reads = count_view_reads(monkeypatch)

    await process.step(t, [t.assistant("Looking.", calls=(("c1", "bash", {"cmd": "ls"}),))])
    out = await process.step(t, [t.outcome("c1", "a.py\nb.py\n")])
    both = await process.step(t, [t.user("and b?", key="u2"), t.assistant("b is fine.", key="a2")])

    assert reads == []
    assert process.loader.trust.extended == 3
    assert both.messages[-1].content == "b is fine."
    assert out.messages[-1].role == "tool"
    _same(both, await _loaded(process.store, t))


async def test_a_batch_that_writes_more_than_records_is_not_handed_over_and_the_step_reads_the_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process, t = _Process(MemoryStore()), Thread()
    await process.record([t.user("Read the log.", key="u1"), t.assistant(calls=(("c1", "cat", {}),))])
    await process.service.prepare(_request(t))
    reads = count_view_reads(monkeypatch)

    # Long: its text goes to a blob, a write beside the records (not one statement).
    prepared = await process.step(t, [t.outcome("c1", "line\n" * 4_000)])

    assert reads == [t.thread_id]
    assert process.loader.trust.extended == 0
    _same(prepared, await _loaded(process.store, t))


async def test_a_view_another_writer_moved_meanwhile_is_not_extended_and_the_step_reads_the_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, t = MemoryStore(), Thread()
    process, other = _Process(store), _Process(store)
    await process.record([t.user("first", key="u1")])
    await process.service.prepare(_request(t))
    other.seq = process.seq
    await other.record([t.user("second", key="u2")])  # another process's recorder (a rebalance)
    process.seq = other.seq
    process.loader.trust.head_moved(t.thread_id, 2)  # its commit, as the database announces it
    reads = count_view_reads(monkeypatch)

    prepared = await process.step(t, [t.user("third", key="u3")])

    assert reads == [t.thread_id]
    assert process.loader.trust.extended == 0
    assert [m.content for m in prepared.messages][-3:] == ["first", "second", "third"]
    _same(prepared, await _loaded(store, t))


async def test_a_step_whose_event_was_committed_before_it_arrived_is_answered_from_the_extended_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process, t = _Process(MemoryStore()), Thread()
    await process.record([t.user("first", key="u1")])
    await process.service.prepare(_request(t))
    reads = count_view_reads(monkeypatch)

    await process.record([t.user("second", key="u2")])  # extended before the prepare arrives
    prepared = await process.service.prepare(_request(t, after="u2"))

    assert reads == []  # the ledger said where the event is; the view held already holds it
    assert prepared.messages[-1].content == "second"
    _same(prepared, await _loaded(process.store, t))
