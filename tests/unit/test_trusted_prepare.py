"""A prepare naming no event is answered from the view its process loaded last while nothing of that
view was announced changed; one naming its event reads the ledger (unless its own
recorder handed the view over: tests/unit/test_handed_views.py). In-memory store, the ledger reads
counted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contracts import PrepareRequest
from services.app.calibrations import CalibrationCache
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.app.views import ViewLoader
from services.app.view_trust import ViewTrust
from services.core.ledger import RecordingLimits
from services.errors import ThreadNotFound
from services.core.calibration import Calibration
from services.store.memory import MemorySession, MemoryStore
from tests.fixtures.builders import Thread, incoming
from tests.fixtures.ledger_reads import NoDeadLetters, count_view_reads

pytestmark = pytest.mark.anyio


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _request(t: Thread, after: str | None = None, **kw: Any) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=8_000,
        after_event_key=after,
        **kw,
    )


class _Fleet:
    """One process's assembler on a store, with its listener up and a clock of its own."""

    def __init__(self, max_age_s: float = 5.0) -> None:
        self.store = MemoryStore()
        self.clock = _Clock()
        self.loader = ViewLoader(trust=ViewTrust(max_age_s=max_age_s, clock=self.clock))
        self.loader.calibrations = CalibrationCache(trust=self.loader.trust, clock=self.clock)
        self.loader.trust.listening()
        self.board = NoticeBoard(changed=lambda thread_id: self.loader.trust.changed("thread", thread_id))
        self.service = PrepareService(self.store, self.board, loader=self.loader)
        self._recorder = RecordingService(
            self.store, NoDeadLetters(), limits=RecordingLimits(), recorder_id="unit"
        )
        self.seq = 1

    async def record(self, events: list[Any], *, tell_board: bool = True) -> None:
        result = await self._recorder.record_batch(0, incoming(events, start_seq=self.seq))
        self.seq += len(events)
        if tell_board:
            for thread_id in result.heads:
                self.board.notify(thread_id)


async def _prepared_once() -> tuple[_Fleet, Thread]:
    """A fleet whose thread has one record and one prepare: its view is held and trusted."""
    fleet, t = _Fleet(), Thread()
    await fleet.record([t.user("first", key="u1")])
    await fleet.service.prepare(_request(t))
    return fleet, t


async def test_a_prepare_naming_no_event_is_answered_again_without_reading_the_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, t = _Fleet(), Thread()
    await fleet.record([t.system("Be brief.", key="sys"), t.user("first", key="u1")])
    reads = count_view_reads(monkeypatch)

    first = await fleet.service.prepare(_request(t))
    second = await fleet.service.prepare(_request(t))

    assert reads == [t.thread_id]
    assert second.messages == first.messages
    assert second.source_watermark == first.source_watermark
    assert fleet.loader.trust.served == 1


async def test_a_prepare_naming_its_event_reads_the_ledger_unless_the_view_held_holds_the_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, t = await _prepared_once()
    reads = count_view_reads(monkeypatch)

    await fleet.service.prepare(_request(t, after="u1"))  # the view held holds it: no read
    assert reads == []
    # Another process records the next event; its notice has not reached this one yet.
    await fleet.record([t.user("second", key="u2")], tell_board=False)
    prepared = await fleet.service.prepare(_request(t, after="u2"))

    assert reads == [t.thread_id]
    assert prepared.messages[-1].content == "second"


async def test_a_thread_this_process_was_told_of_is_read_again_and_shows_its_new_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, t = await _prepared_once()
    reads = count_view_reads(monkeypatch)

    await fleet.record([t.user("second", key="u2")])
    prepared = await fleet.service.prepare(_request(t))

    assert reads == [t.thread_id]
    assert prepared.messages[-1].content == "second"


async def test_a_change_announced_by_the_database_alone_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, t = await _prepared_once()
    # Another process recorded it: no notice of this process, only the listener's.
    await fleet.record([t.user("second", key="u2")], tell_board=False)
    stale = await fleet.service.prepare(_request(t))
    assert stale.messages[-1].content == "first"  # nothing announced yet: the notice is in flight

    fleet.loader.trust.changed("thread", t.thread_id)
    prepared = await fleet.service.prepare(_request(t))

    assert prepared.messages[-1].content == "second"


async def test_a_change_of_the_session_is_read_again_and_a_foreign_principal_is_refused() -> None:
    fleet, t = await _prepared_once()
    async with fleet.store.session() as s:
        s._t.sessions[t.session_id]["principal_id"] = "alice"  # another process's principal event

    fleet.loader.trust.changed("session", t.session_id)

    with pytest.raises(ThreadNotFound):
        await fleet.service.prepare(_request(t))


async def test_a_trusted_view_is_never_served_to_another_session_tenant_or_principal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, t = _Fleet(), Thread(principal_id="alice")
    await fleet.record([t.user("first", key="u1")])
    await fleet.service.prepare(_request(t, principal_id="alice"))
    reads = count_view_reads(monkeypatch)

    with pytest.raises(ThreadNotFound):
        await fleet.service.prepare(_request(t, principal_id="mallory"))
    with pytest.raises(ThreadNotFound):
        await fleet.service.prepare(
            _request(t).model_copy(update={"session_id": "s-other", "principal_id": "alice"})
        )
    with pytest.raises(ThreadNotFound):
        await fleet.service.prepare(_request(t, principal_id="alice"), tenant="someone-else")

    assert reads == [t.thread_id] * 3  # each asked the ledger, which refused it as before


async def test_a_view_past_half_its_age_is_served_and_loaded_again_behind_the_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, t = await _prepared_once()
    reads = count_view_reads(monkeypatch)

    fleet.clock.now += 3.0
    await fleet.service.prepare(_request(t))
    assert reads == []  # served from the view; its reload runs after the reply
    await asyncio.sleep(0.01)
    assert reads == [t.thread_id]

    fleet.clock.now += 3.0  # 6 s after the first load, 3 s after the reload
    await fleet.service.prepare(_request(t))
    assert reads == [t.thread_id]


async def test_the_reload_behind_a_reply_waits_until_its_process_has_answered_its_prepares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, t = _Fleet(), Thread()
    quiet = asyncio.Event()

    async def answered() -> None:
        await quiet.wait()

    fleet.service = PrepareService(fleet.store, fleet.board, loader=fleet.loader, quiet=answered)
    await fleet.record([t.user("first", key="u1")])
    await fleet.service.prepare(_request(t))
    reads = count_view_reads(monkeypatch)
    fleet.clock.now += 3.0
    await fleet.service.prepare(_request(t))
    await fleet.service.prepare(_request(t))  # one reload at a time
    await asyncio.sleep(0.01)
    assert reads == []

    quiet.set()
    await asyncio.sleep(0.01)
    assert reads == [t.thread_id]


async def test_a_view_not_used_for_its_whole_age_is_read_again() -> None:
    fleet, t = await _prepared_once()
    fleet.clock.now += 5.1

    assert (
        fleet.loader.trusted(t.thread_id, tenant="default", session_id=t.session_id, principal_id=None)
        is None
    )


async def test_a_view_outlives_its_calibrations_ttl_until_that_calibrations_change_is_announced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet, t = _Fleet(max_age_s=30.0), Thread()
    await fleet.record([t.user("first", key="u1")])
    await fleet.service.prepare(_request(t))
    reads = count_view_reads(monkeypatch)
    calibrations: list[str] = []
    real = MemorySession.read_calibration

    async def counted(self: MemorySession, tenant: str, profile: str) -> Calibration:
        calibrations.append(profile)
        return await real(self, tenant, profile)

    monkeypatch.setattr(MemorySession, "read_calibration", counted)

    fleet.clock.now += 10.0  # an agent's think time: twice the calibration's own 5 s
    await fleet.service.prepare(_request(t))
    assert reads == [] and calibrations == []

    fleet.loader.trust.calibration_changed("default", "gpt-4o")  # another replica learned
    await fleet.service.prepare(_request(t))
    assert reads == [t.thread_id] and calibrations == ["gpt-4o"]


async def test_nothing_is_trusted_while_the_listener_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet, t = await _prepared_once()
    fleet.loader.trust.deaf()
    reads = count_view_reads(monkeypatch)

    await fleet.service.prepare(_request(t))
    await fleet.service.prepare(_request(t))

    assert reads == [t.thread_id, t.thread_id]


def test_a_loader_trusts_nothing_until_its_listener_listens_and_nothing_at_all_with_an_age_of_zero() -> None:
    loader = ViewLoader(trust_s=1.0)
    assert not loader.trust.enabled and loader.trust.token() is None
    loader.trust.listening()
    assert loader.trust.enabled
    off = ViewLoader()  # CTX_VIEW_TRUST_MS=0, and every loader outside an assembler process
    off.trust.listening()
    assert not off.trust.enabled
