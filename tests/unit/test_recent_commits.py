"""A prepare naming an event its own process's recorder committed lately, or is about to, asks the
ledger nothing; the board's memory of those commits is bounded and per tenant."""

from __future__ import annotations

import asyncio

import pytest

from contracts import Event
from contracts.subjects import DEFAULT_TENANT
from services.app.notices import RECENT_KEYS, RECENT_THREADS, RECENT_TOTAL_KEYS, Committed, NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.core.ledger import RecordingLimits
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming
from tests.fixtures.ledger_checks import counting_checks, waiting_for

pytestmark = pytest.mark.anyio

# A content hash the board passes along untouched (these tests are about which keys it keeps).
SHA = "c" * 64


def _keys(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, SHA)


class _Sink:
    async def publish(self, letter: object, msg_id: str) -> None:
        pass


async def _record_and_hand_over(
    store: MemoryStore, board: NoticeBoard, t: Thread, events: list[Event], start_seq: int
) -> None:
    """What the recorder of the prepare's own process does: commit, then hand the keys over."""
    recorder = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit")
    result = await recorder.record_batch(0, incoming(events, start_seq=start_seq))
    board.recorded(t.thread_id, *result.committed[t.thread_id], result.heads[t.thread_id])


async def test_a_prepare_naming_an_event_its_own_recorder_committed_lately_asks_the_ledger_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    await _record_and_hand_over(
        store, board, t, [t.system("Be brief.", key="sys"), t.user("hi", key="u1")], 1
    )
    checks = counting_checks(monkeypatch)

    prepared = await PrepareService(store, board).prepare(waiting_for(t, "sys"))

    assert checks == []
    # Answered through the head the batch moved to, which holds the named event and the one after it.
    assert (prepared.source_watermark.last_event_key, prepared.source_watermark.thread_seq) == ("u1", 2)


async def test_a_prepare_naming_an_event_still_on_its_way_to_its_own_recorder_waits_for_the_handover_unasked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    await _record_and_hand_over(store, board, t, [t.user("first", key="u1")], 1)
    checks = counting_checks(monkeypatch)

    # Sent with its publish: it reaches the assembler before the event reaches the recorder.
    waiting = asyncio.create_task(PrepareService(store, board).prepare(waiting_for(t, "u2")))
    await asyncio.sleep(0.005)
    assert not waiting.done()
    await _record_and_hand_over(store, board, t, [t.user("second", key="u2")], 2)
    prepared = await asyncio.wait_for(waiting, timeout=2)

    assert checks == []
    assert prepared.messages[-1].content == "second"


async def test_a_prepare_naming_an_event_older_than_the_boards_memory_is_answered_from_the_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    for n in range(RECENT_KEYS + 1):
        await _record_and_hand_over(store, board, t, [t.user(f"turn {n}", key=f"u{n}")], n + 1)
    checks = counting_checks(monkeypatch)

    prepared = await asyncio.wait_for(PrepareService(store, board).prepare(waiting_for(t, "u0")), timeout=2)

    assert checks == ["u0"]  # forgotten, so asked for once the grace passed with no handover
    assert prepared.source_watermark.last_event_key == f"u{RECENT_KEYS}"


async def test_a_thread_another_process_records_is_asked_about_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    recorder = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="elsewhere")
    await recorder.record_batch(0, incoming([t.user("first", key="u1")]))
    checks = counting_checks(monkeypatch)

    prepared = await PrepareService(store, board).prepare(waiting_for(t, "u1"))

    assert checks == ["u1"] and prepared.source_watermark.last_event_key == "u1"


def test_the_board_remembers_committed_keys_per_tenant_and_thread_within_its_bounds() -> None:
    board = NoticeBoard()
    board.recorded("r-1.main", DEFAULT_TENANT, _keys("a", "b"), (7, 3))
    board.recorded("r-1.main", "acme", _keys("a"), (9, 4))
    board.recorded("r-2.main", DEFAULT_TENANT, _keys(), (-1, -1))  # only rejected or skipped events

    assert board.recent("r-1.main") == {
        (DEFAULT_TENANT, "a"): Committed(7, SHA),
        (DEFAULT_TENANT, "b"): Committed(7, SHA),
        ("acme", "a"): Committed(9, SHA),
    }
    assert board.recent("r-2.main") is None

    for n in range(RECENT_KEYS + 5):
        board.recorded("r-1.main", DEFAULT_TENANT, _keys(f"k{n}"), (10 + n, 5 + n))
    kept = board.recent("r-1.main")
    assert kept is not None and len(kept) == RECENT_KEYS
    assert (DEFAULT_TENANT, f"k{RECENT_KEYS + 4}") in kept and (DEFAULT_TENANT, "a") not in kept

    for n in range(RECENT_THREADS):
        board.recorded(f"r-x{n}.main", DEFAULT_TENANT, _keys("k"), (1, 1))
    assert board.recent("r-1.main") is None  # the least recently recorded thread went first
    assert board.recent(f"r-x{RECENT_THREADS - 1}.main") == {(DEFAULT_TENANT, "k"): Committed(1, SHA)}


async def test_a_key_another_tenant_committed_on_the_thread_says_nothing_of_this_tenants_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    recorder = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit")
    await recorder.record_batch(0, incoming([t.user("first", key="u1")]))
    board.recorded(t.thread_id, "acme", _keys("u1"), (1, 1))
    checks = counting_checks(monkeypatch)

    prepared = await asyncio.wait_for(PrepareService(store, board).prepare(waiting_for(t, "u1")), timeout=2)

    assert checks == ["u1"] and prepared.source_watermark.last_event_key == "u1"


def test_every_key_of_a_threads_last_batch_is_remembered_however_large_and_all_keys_stay_bounded() -> None:
    board = NoticeBoard()
    burst = _keys(*(f"e{n}" for n in range(3 * RECENT_KEYS)))  # a replay's or a burst's batch
    board.recorded("r-1.main", DEFAULT_TENANT, burst, (48, 1))
    assert set(board.recent("r-1.main") or {}) == {(DEFAULT_TENANT, key) for key in burst}

    board.recorded("r-1.main", DEFAULT_TENANT, _keys("next"), (49, 2))
    kept = board.recent("r-1.main") or {}
    assert len(kept) == RECENT_KEYS and kept[(DEFAULT_TENANT, "next")].through == 49

    batch = 256  # the recorder's largest batch
    for n in range(RECENT_TOTAL_KEYS // batch + 1):
        board.recorded(f"r-b{n}.main", DEFAULT_TENANT, _keys(*(f"k{i}" for i in range(batch))), (batch, 1))
    assert board.recent("r-1.main") is None and board.recent("r-b0.main") is None
    assert len(board.recent(f"r-b{RECENT_TOTAL_KEYS // batch}.main") or {}) == batch
