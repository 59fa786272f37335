"""The recording, preparing and compacting shells on the in-memory store: no server involved."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contracts import (
    CompactRequest,
    CompactionJob,
    CompactionPolicy,
    ContextPolicy,
    DeadLetter,
    InspectRequest,
    PrepareRequest,
)
from contracts.subjects import DEFAULT_TENANT
from services.app.compacting import CompactionService
from services.app.manual_compaction import ManualCompaction
from services.core.compaction.model import Segment, StructuredSummary
from services.core.compaction.structured import summarize_records
from contracts.exceptions import (
    EventRejected,
    FleetUnavailable,
    NotYetRecorded,
    PositionRegressed,
    StoreUnavailable,
)
from services.core.ledger import BatchPlan, RecordingLimits
from services.app.freshness import RECHECK_S
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.app.scheduling import request_job
from contracts.exceptions import StoreRejected
from services.store.batch_write import LedgerWritten
from services.store.memory import MemoryConnection, MemoryStore
from services.app.views import ViewLoader
from tests.fixtures.builders import Thread, incoming
from tests.fixtures.ledger_checks import counting_checks, waiting_for

pytestmark = pytest.mark.anyio


class _Sink:
    def __init__(self) -> None:
        self.letters: dict[str, DeadLetter] = {}

    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        self.letters.setdefault(msg_id, letter)


class _Queue:
    def __init__(self) -> None:
        self.jobs: list[CompactionJob] = []

    async def publish(self, job: CompactionJob) -> None:
        self.jobs.append(job)


def _recorder(store: MemoryStore, sink: _Sink | None = None) -> RecordingService:
    return RecordingService(store, sink or _Sink(), limits=RecordingLimits(), recorder_id="unit")


async def _keys(store: MemoryStore, thread_id: str) -> list[str]:
    async with store.connection() as s:
        head = await s.select_head(thread_id)
        records = await s.select_records(thread_id, gt=0, lte=head.last_seq if head else 0)
    return [r.event_key for r in records]


async def test_a_batch_with_an_invalid_event_and_a_duplicate_records_the_rest_once_and_dead_letters_one() -> (
    None
):
    store, sink = MemoryStore(), _Sink()
    t = Thread()
    first = [t.user("q1", key="k1"), t.assistant("a1", key="k2")]
    await _recorder(store, sink).record_batch(0, incoming(first))
    orphan = t.outcome("c-missing", "no such call", key="k3")  # an outcome of a call never made
    redelivered = t.user("q1", key="k1")  # the same key and content again: a client retry
    batch = incoming([redelivered, orphan, t.user("q2", key="k4")], start_seq=3)

    result = await _recorder(store, sink).record_batch(0, batch)

    assert (result.recorded, result.duplicates, result.skipped) == (1, 1, 0)
    assert [(r.code.value, r.event_key) for r in result.rejections] == [("orphan_tool_outcome", "k3")]
    assert await _keys(store, t.thread_id) == ["k1", "k2", "k4"]
    (letter,) = sink.letters.values()
    assert (letter.code.value, letter.event_key, letter.stream_seq) == ("orphan_tool_outcome", "k3", 4)
    async with store.connection() as s:
        assert await s.count_dead_letters(t.thread_id) == 1
        assert (await s.find_event_outcome(DEFAULT_TENANT, t.thread_id, "k3")).rejected == (
            "orphan_tool_outcome",
            letter.reason,
        )
        assert await s.max_tracking_seq("recorder", 0) == 5
    # Redelivered whole after a crash before the ack: nothing is applied twice.
    again = await _recorder(store, sink).record_batch(0, batch)
    assert (again.recorded, again.skipped, again.rejections) == (0, 3, ())


async def test_a_batch_redelivered_with_new_events_after_it_applies_only_the_new_ones_in_order() -> None:
    # The partition's position is read with the batch's reads (one round trip): what it covers is
    # skipped, even an event that would now be rejected, and the rest is recorded once.
    store, sink = MemoryStore(), _Sink()
    t = Thread()
    applied = incoming([t.user("q1", key="k1"), t.outcome("c-missing", "orphan", key="k2")])
    await _recorder(store, sink).record_batch(0, applied)
    assert len(sink.letters) == 1
    tail = incoming([t.user("q2", key="k3")], start_seq=3)

    result = await _recorder(store, sink).record_batch(0, [*applied, *tail])

    assert (result.recorded, result.duplicates, result.skipped, result.rejections) == (1, 0, 2, ())
    assert await _keys(store, t.thread_id) == ["k1", "k3"]
    assert len(sink.letters) == 1
    async with store.connection() as s:
        assert await s.max_tracking_seq("recorder", 0) == 3
        assert await s.count_dead_letters(t.thread_id) == 1


async def test_a_store_behind_its_recorder_refuses_the_batch_and_a_re_read_records_all_once_in_order() -> (
    None
):
    # The recorder's commits do not wait for the WAL flush: a store that crashed may come
    # back without the last of them. Applied over that gap, the next batch would skip them for good.
    t = Thread()
    first = incoming([t.user("q1", key="k1"), t.assistant("a1", key="k2")])
    lost = incoming([t.user("q2", key="k3")], start_seq=3)
    after = incoming([t.user("q3", key="k4")], start_seq=4)
    recovered = MemoryStore()  # holds the first batch only: the second was lost with the crash
    await _recorder(recovered).record_batch(0, first, committed=0)

    with pytest.raises(PositionRegressed) as refused:
        await _recorder(recovered).record_batch(0, after, committed=3)

    assert (refused.value.code.value, refused.value.details) == (
        "position_regressed",
        {"partition": 0, "committed": 3, "found": 2},
    )
    assert refused.value.retryable
    assert await _keys(recovered, t.thread_id) == ["k1", "k2"]
    async with recovered.connection() as s:
        position = await s.max_tracking_seq("recorder", 0)
    assert position == 2
    # Read again from the position the store holds: the lost event, then the new one.
    result = await _recorder(recovered).record_batch(0, [*lost, *after], committed=position)
    assert (result.recorded, result.duplicates, result.skipped) == (2, 0, 0)
    assert await _keys(recovered, t.thread_id) == ["k1", "k2", "k3", "k4"]


async def test_a_store_ahead_of_what_its_recorder_committed_skips_what_it_covers() -> None:
    # Another recorder of the partition got there first: that is not a loss.
    store = MemoryStore()
    t = Thread()
    batch = incoming([t.user("q1", key="k1"), t.user("q2", key="k2")])
    await _recorder(store).record_batch(0, batch, committed=0)

    result = await _recorder(store).record_batch(0, batch, committed=0)

    assert (result.recorded, result.skipped) == (0, 2)


async def test_an_event_the_store_refuses_is_set_aside_and_the_rest_recorded_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, sink = MemoryStore(), _Sink()
    t = Thread()
    real = MemoryConnection.write_plan

    async def refusing(self: MemoryConnection, plan: BatchPlan, **kw: Any) -> LedgerWritten:
        if any(r.event_key == "k2" for r in plan.records):
            raise StoreRejected("DataError", "22000", "invalid input for query argument $9")
        return await real(self, plan, **kw)

    monkeypatch.setattr(MemoryConnection, "write_plan", refusing)
    result = await _recorder(store, sink).record_batch(
        0, incoming([t.user("q1", key="k1"), t.user("q2", key="k2"), t.user("q3", key="k3")])
    )

    assert await _keys(store, t.thread_id) == ["k1", "k3"]
    (rejection,) = result.rejections
    assert (rejection.code.value, rejection.event_key) == ("unstorable_event", "k2")
    assert rejection.details == {"stage": "write", "error": "DataError", "sqlstate": "22000"}
    assert [letter.event_key for letter in sink.letters.values()] == ["k2"]
    async with store.connection() as s:
        assert await s.max_tracking_seq("recorder", 0) == 3


async def test_a_store_outage_dead_letters_nothing_and_a_retry_records_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, sink = MemoryStore(), _Sink()
    t = Thread()
    real = MemoryConnection.write_plan
    failures = iter([StoreUnavailable("ConnectionDoesNotExistError: connection was closed")])

    async def flaky(self: MemoryConnection, plan: BatchPlan, **kw: Any) -> None:
        if (failure := next(failures, None)) is not None:
            raise failure
        await real(self, plan, **kw)

    monkeypatch.setattr(MemoryConnection, "write_plan", flaky)
    batch = incoming([t.user("q1", key="k1"), t.user("q2", key="k2")])
    with pytest.raises(StoreUnavailable):
        await _recorder(store, sink).record_batch(0, batch)
    assert await _keys(store, t.thread_id) == [] and not sink.letters
    assert (await _recorder(store, sink).record_batch(0, batch)).recorded == 2


async def _recorded(store: MemoryStore, board: NoticeBoard, events: list, start_seq: int = 1) -> None:  # type: ignore[type-arg]
    result = await _recorder(store).record_batch(0, incoming(events, start_seq=start_seq))
    for thread_id in result.heads:
        board.notify(thread_id)


async def test_a_prepare_waits_for_its_event_and_answers_once_it_is_recorded() -> None:
    store, board = MemoryStore(), NoticeBoard()
    t = Thread()
    await _recorded(store, board, [t.system("Be brief.", key="sys"), t.user("first", key="u1")])
    service = PrepareService(store, board)
    request = waiting_for(t, "u2")

    waiting = asyncio.create_task(service.prepare(request))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # u2 is not in the ledger yet
    await _recorded(store, board, [t.user("second, the one asked for", key="u2")], start_seq=3)
    prepared = await asyncio.wait_for(waiting, timeout=2)

    assert (prepared.source_watermark.last_event_key, prepared.source_watermark.thread_seq) == ("u2", 3)
    assert prepared.messages[-1].content == "second, the one asked for"
    inspection = await service.inspect(t.thread_id, InspectRequest(limit=2))
    assert (inspection.record_count, inspection.chain_verified, inspection.state_verified) == (3, True, True)
    assert [r.event_key for r in inspection.records] == ["u1", "u2"]


async def test_a_notice_only_wakes_a_waiting_prepare_and_the_ledger_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, board = MemoryStore(), NoticeBoard()
    t = Thread()
    await _recorded(store, board, [t.user("first", key="u1")])
    checks = counting_checks(monkeypatch)
    service = PrepareService(store, board)
    waiting = asyncio.create_task(service.prepare(waiting_for(t, "u2")))
    await asyncio.sleep(0.05)
    assert checks == ["u2"] and not waiting.done()

    board.notify(t.thread_id)  # a notice of something else (or forged): asked again, still waiting
    await asyncio.sleep(0.05)
    assert checks == ["u2", "u2"] and not waiting.done()

    await _recorded(store, board, [t.user("second", key="u2")], start_seq=2)
    prepared = await asyncio.wait_for(waiting, timeout=2)

    assert checks == ["u2", "u2", "u2"]
    assert prepared.source_watermark.last_event_key == "u2"


async def test_a_prepare_whose_events_notice_is_lost_is_answered_on_its_next_look_at_the_ledger() -> None:
    store, board = MemoryStore(), NoticeBoard()
    t = Thread()
    await _recorded(store, board, [t.user("first", key="u1")])
    waiting = asyncio.create_task(PrepareService(store, board).prepare(waiting_for(t, "u2")))
    await asyncio.sleep(0.05)

    await _recorded(store, NoticeBoard(), [t.user("second", key="u2")], start_seq=2)  # nobody told
    prepared = await asyncio.wait_for(waiting, timeout=2 * RECHECK_S + 1)

    assert prepared.source_watermark.last_event_key == "u2"


async def test_a_prepare_after_a_commit_it_was_not_told_of_sees_it() -> None:
    """Another process's recorder committed; this process heard nothing, yet its next prepare shows it."""
    store, board = MemoryStore(), NoticeBoard()
    t = Thread()
    await _recorded(store, board, [t.user("first", key="u1")])
    service = PrepareService(store, board)
    before = await service.prepare(waiting_for(t, "u1"))

    await _recorded(store, NoticeBoard(), [t.user("second", key="u2")], start_seq=2)
    after = await service.prepare(waiting_for(t, "u1").model_copy(update={"after_event_key": None}))

    assert before.source_watermark.last_event_key == "u1"
    assert after.source_watermark.last_event_key == "u2" and after.messages[-1].content == "second"


async def test_a_prepare_for_an_event_never_recorded_times_out_and_a_rejected_one_says_why() -> None:
    store, board = MemoryStore(), NoticeBoard()
    t = Thread()
    await _recorded(store, board, [t.user("first", key="u1"), t.outcome("c-none", "orphan", key="bad")])
    service = PrepareService(store, board)

    def asking(key: str) -> PrepareRequest:
        return waiting_for(t, key, wait_ms=100)

    with pytest.raises(NotYetRecorded):
        await service.prepare(asking("never"))
    with pytest.raises(EventRejected) as rejected:
        await service.prepare(asking("bad"))
    assert rejected.value.details["rejected_code"] == "orphan_tool_outcome"


async def _history(store: MemoryStore, t: Thread, budget: int = 2_000, groups: int = 6) -> None:
    await store.register_policy(
        DEFAULT_TENANT,
        ContextPolicy(name="tight", model_profile=None, budget_tokens=budget, compaction=CompactionPolicy()),
    )
    events = [t.system("You fix bugs in a Python repository.").model_copy(update={"policy": "tight"})]
    events.append(t.user("Fix the failing import in app.py", key="task"))
    for i in range(groups):
        events.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat file{i}.py"}),)))
        events.append(t.outcome(f"c{i}", f"contents of file{i}.py " * 60, key=f"out{i}"))
    await _recorder(store).record_batch(0, incoming(events))


async def _job(store: MemoryStore, thread_id: str) -> CompactionJob:
    async with store.connection() as s:
        view = await ViewLoader().load(s, thread_id)
        job = await request_job(s, _Queue(), view, ("context_ratio",))
    assert job is not None
    return job


class _RefusingQueue:
    """A queue whose JetStream store is full: every job refused, typed."""

    def __init__(self) -> None:
        self.tries = 0

    async def publish(self, job: CompactionJob) -> None:
        self.tries += 1
        raise FleetUnavailable("JetStream did not store the compaction job: insufficient resources (503)")


async def test_a_prepare_whose_compaction_job_is_refused_is_answered_at_once_without_the_oldest_history() -> (
    None
):
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    await _history(store, t, budget=100_000)
    queue = _RefusingQueue()
    service = PrepareService(store, board, queue=queue, compaction_wait_ms=5_000)
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=900
    )

    started = asyncio.get_running_loop().time()
    prepared = await service.prepare(request)

    # Not after the 5 s compaction wait: no compaction is coming.
    assert asyncio.get_running_loop().time() - started < 1.0 and queue.tries == 1
    assert prepared.budget_report.used.total <= 900
    assert prepared.budget_report.reductions.dropped_history > 0 and prepared.summary is None
    async with store.connection() as s:
        # The refused job is not left pending: the next prepare or the budgeter asks again.
        assert (await s.load_view(t.thread_id)).pending_fingerprint is None


async def test_a_preview_of_an_over_budget_view_asks_for_no_compaction_and_says_the_prepare_would() -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    await _history(store, t, budget=100_000)
    queue = _Queue()
    # No wait: the prepare below only has to ask (nothing compacts here).
    service = PrepareService(store, board, queue=queue, compaction_wait_ms=0)
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=900
    )

    prepared, would = await service.preview(request)

    assert queue.jobs == [] and len(would) == 1 and would[0].startswith("ask for a hard_budget compaction")
    assert prepared.budget_report.used.total <= 900 and prepared.budget_report.reductions.dropped_history > 0
    async with store.connection() as s:
        assert (await s.load_view(t.thread_id)).pending_fingerprint is None
    await service.prepare(request)  # what the preview did not do
    assert len(queue.jobs) == 1


async def test_a_compaction_commits_a_summary_and_moves_the_view_and_its_baseline() -> None:
    store, t = MemoryStore(), Thread()
    await _history(store, t)
    job = await _job(store, t.thread_id)

    outcome = await CompactionService(store, ViewLoader()).run(job)

    assert (outcome.status, outcome.view_revision) == ("committed", 1)
    assert outcome.tokens_after < outcome.tokens_before
    async with store.connection() as s:
        state = await s.load_view(t.thread_id)
        assert await s.summary_count(t.thread_id) == 1
    assert state.view_revision == 1 and state.summary is not None and state.covered_to > 0
    assert state.baseline.model_steps > 0 and state.pending_fingerprint is None


async def test_a_manual_compaction_of_a_thread_no_budgeter_evaluated_yet_commits() -> None:
    store, t = MemoryStore(), Thread()
    await _history(store, t)  # recorded only: no budgeter pass has created the thread's view row
    loader = ViewLoader()
    manual = ManualCompaction(store, loader, CompactionService(store, loader))

    reply = await manual.compact(
        CompactRequest(run_id=t.run_id, instance_id=t.instance_id, session_id=t.session_id),
        tenant=DEFAULT_TENANT,
    )

    assert reply.view_revision == 1 and reply.covered_to > 0


class _Racing:
    """Summarizes normally, but another compactor commits while this one's summarizer runs."""

    name = "racing"

    def __init__(self, store: MemoryStore, thread_id: str) -> None:
        self.store, self.thread_id, self.raced = store, thread_id, False

    async def summarize(self, segment: Segment) -> StructuredSummary:
        # The job holds no connection while its summarizer runs (a network call in production).
        assert self.store.open_sessions == 0
        if not self.raced:  # the rival commits during the first of this job's summarizer calls
            self.raced = True
            rival = await _job_unclaimed(self.store, self.thread_id)
            assert (await CompactionService(self.store, ViewLoader()).run(rival)).status == "committed"
        return summarize_records(segment.records)


async def _job_unclaimed(store: MemoryStore, thread_id: str) -> CompactionJob:
    # The rival holds a copy of the same job: the pending slot is already claimed by the racer.
    async with store.connection() as s:
        view = await ViewLoader().load(s, thread_id)
    return CompactionJob(
        job_id="rival",
        thread_id=thread_id,
        session_id=view.head.session_id,
        watermark=view.watermark,
        view_revision=view.state.view_revision,
        policy_name=view.policy_name,
        policy_revision=view.policy_revision,
        input_budget=view.compaction_budget,
        reasons=("context_ratio",),
    )


async def test_a_compaction_losing_the_revision_race_is_dropped_and_leaves_the_winner_alone() -> None:
    store, t = MemoryStore(), Thread()
    await _history(store, t)
    job = await _job(store, t.thread_id)

    outcome = await CompactionService(store, ViewLoader(), lambda request: _Racing(store, t.thread_id)).run(
        job
    )

    assert (outcome.status, outcome.stage) == ("dropped", "commit")
    async with store.connection() as s:
        state = await s.load_view(t.thread_id)
        assert await s.summary_count(t.thread_id) == 1
    assert state.view_revision == 1 and state.pending_fingerprint is None


async def test_summary_ids_are_derived_from_the_thread_revision_and_range() -> None:
    first, second = MemoryStore(), MemoryStore()
    t = Thread()
    for store in (first, second):
        await _history(store, t)
        await CompactionService(store, ViewLoader()).run(await _job(store, t.thread_id))
    ids = []
    for store in (first, second):
        async with store.connection() as s:
            summary = (await s.load_view(t.thread_id)).summary
        assert summary is not None
        ids.append(summary.summary_id)
    assert ids[0] == ids[1]
