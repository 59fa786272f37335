"""A prepare for an o200k profile never makes the cl100k counts the recorder deferred; one for a
cl100k profile makes them. In memory; the counts' equality is tests/contract's."""

from __future__ import annotations

from typing import Any

import pytest

import services.core.ledger as ledger
from contracts import DeadLetter, PrepareRequest
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.core.ledger import RecordingLimits
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming

pytestmark = pytest.mark.anyio


class _Sink:
    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        raise AssertionError(letter.code)


@pytest.fixture
def cl100k_counts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    real = ledger.count_rendered

    def spy(counter: Any, content: str, calls: Any) -> int:
        n = real(counter, content, calls)
        if counter.name == "cl100k_base":
            made.append(n)
        return n

    monkeypatch.setattr(ledger, "count_rendered", spy)
    return made


async def _thread(store: MemoryStore) -> Thread:
    t = Thread()
    events = [
        t.system("Be brief.", key="sys"),
        t.user("list the files", key="u1"),
        t.assistant("looking", calls=(("c1", "ls", {"path": "."}),), key="a1"),
        t.outcome("c1", "setup.py\nsrc/\n" * 40, key="o1"),
        t.user("thanks", key="u2"),
    ]
    recorder = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit")
    await recorder.record_batch(0, incoming(events))
    return t


def _request(t: Thread, profile: str) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, model_profile=profile
    )


async def test_a_gpt_4o_prepare_never_counts_cl100k(cl100k_counts: list[int]) -> None:
    store = MemoryStore()
    t = await _thread(store)
    prepared = await PrepareService(store, NoticeBoard()).prepare(_request(t, "gpt-4o"))
    assert prepared.messages[-1].content == "thanks"
    assert cl100k_counts == []


async def test_a_cl100k_profile_prepare_counts_the_records_it_reads(cl100k_counts: list[int]) -> None:
    store = MemoryStore()
    t = await _thread(store)
    prepared = await PrepareService(store, NoticeBoard()).prepare(_request(t, "gpt-4-turbo"))
    assert prepared.messages[-1].content == "thanks"
    assert len(cl100k_counts) >= 5  # each record read, counted once
