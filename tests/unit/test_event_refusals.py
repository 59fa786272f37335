"""A prepare naming an event learns at once that the event will never be recorded: its key holds other
content (``after_event_hash``), or the event was refused on another thread's subject — never by
waiting out ``wait_ms``. The common case, its event recorded with the hash it names, asks the ledger once."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from contracts import Event, PrepareRequest, decode_event
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.core.ledger import Incoming, RecordingLimits, content_sha256_of
from contracts.exceptions import EventRejected
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming
from tests.fixtures.ledger_checks import counting_checks, waiting_for

pytestmark = pytest.mark.anyio

# Far longer than any answer here may take: an answer that waited it out would fail the test's timeout.
LONG_WAIT_MS = 30_000


class _Sink:
    async def publish(self, letter: object, msg_id: str) -> None:
        pass


def _recorder(store: MemoryStore) -> RecordingService:
    return RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit")


async def _record(
    store: MemoryStore, board: NoticeBoard | None, t: Thread, events: list[Event], start_seq: int
) -> None:
    """Record ``events``; notify ``board`` of their thread as a recorder's notice does."""
    await _recorder(store).record_batch(0, incoming(events, start_seq=start_seq))
    if board is not None:
        board.notify(t.thread_id)


def _naming(t: Thread, event: Event) -> PrepareRequest:
    request = waiting_for(t, event.event_key, wait_ms=LONG_WAIT_MS)
    return request.model_copy(update={"after_event_hash": content_sha256_of(event)})


async def test_a_prepare_naming_its_event_by_the_recorded_hash_asks_the_ledger_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    first = t.user("first", key="u1")
    await _record(store, board, t, [first], 1)
    checks = counting_checks(monkeypatch)

    prepared = await asyncio.wait_for(PrepareService(store, board).prepare(_naming(t, first)), timeout=2)

    assert checks == ["u1"] and prepared.source_watermark.last_event_key == "u1"


async def test_a_prepare_naming_a_key_the_ledger_holds_with_other_content_is_rejected_after_one_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, t = MemoryStore(), Thread()
    await _record(store, None, t, [t.user("first", key="u1")], 1)
    checks = counting_checks(monkeypatch)

    reused = t.user("a different question under the same key", key="u1")
    with pytest.raises(EventRejected) as refused:
        await asyncio.wait_for(PrepareService(store, NoticeBoard()).prepare(_naming(t, reused)), timeout=2)

    assert checks == ["u1"] and refused.value.details["rejected_code"] == "event_key_conflict"
    assert not refused.value.retryable and content_sha256_of(reused) in str(refused.value.details["reason"])


async def test_a_prepare_waiting_for_its_event_is_rejected_when_the_key_is_committed_with_other_content(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    await _record(store, board, t, [t.user("first", key="u1")], 1)
    checks = counting_checks(monkeypatch)

    waiting = asyncio.create_task(
        PrepareService(store, board).prepare(_naming(t, t.user("what the runtime sent", key="u2")))
    )
    await asyncio.sleep(0.005)
    assert not waiting.done()
    await _record(store, board, t, [t.user("what was recorded first", key="u2")], 2)

    with pytest.raises(EventRejected) as refused:
        await asyncio.wait_for(waiting, timeout=2)
    # One check before the commit, one on its notice: not the re-check interval later.
    assert checks == ["u2", "u2"] and refused.value.details["rejected_code"] == "event_key_conflict"


async def test_a_prepare_without_a_hash_is_answered_from_whatever_its_key_recorded() -> None:
    store, board, t = MemoryStore(), NoticeBoard(), Thread()
    await _record(store, board, t, [t.user("first", key="u1")], 1)

    prepared = await PrepareService(store, board).prepare(waiting_for(t, "u1"))

    assert prepared.messages[-1].content == "first"


async def test_a_prepare_on_the_thread_an_event_names_hears_at_once_it_went_to_another_subject() -> None:
    store, board = MemoryStore(), NoticeBoard()
    subject_thread = Thread()
    body_thread = Thread(session_id=subject_thread.session_id)
    event = body_thread.user("published on the wrong subject", key="w1")
    misfiled = Incoming(
        subject=f"ctx.p.0.default.{subject_thread.session_id}.{subject_thread.thread_id}",
        data=event.model_dump_json().encode(),
        stream_seq=1,
    )
    result = await _recorder(store).record_batch(0, [misfiled])
    (rejection,) = result.rejections
    assert (rejection.thread_id, rejection.named_thread) == (subject_thread.thread_id, body_thread.thread_id)

    service = PrepareService(store, board)
    for thread in (body_thread, subject_thread):
        with pytest.raises(EventRejected) as refused:
            await asyncio.wait_for(service.prepare(waiting_for(thread, "w1", LONG_WAIT_MS)), timeout=2)
        assert refused.value.details["rejected_code"] == "thread_mismatch" and not refused.value.retryable


def test_the_content_hash_wire_md_teaches_is_the_one_the_ledger_records() -> None:
    wire = (Path(__file__).parents[2] / "docs" / "wire.md").read_text(encoding="utf-8")
    example = re.search(r"event \(no trailing newline\)\n\n```json\n(.+?)\n```", wire)
    taught = re.search(r"whose SHA-256 is `([0-9a-f]{64})`", wire)
    assert example is not None and taught is not None
    event = decode_event(example.group(1).encode(), max_bytes=1_000)
    assert content_sha256_of(event) == taught.group(1)
