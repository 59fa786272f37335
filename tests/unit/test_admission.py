"""Admission control: bounded slots, a bounded queue, typed refusals, waits that hold no slot."""

from __future__ import annotations

import asyncio

import pytest

from ctxfleet_client.client import DEADLINE_HEADER
from contracts.exceptions import Overloaded
from workers.admission import Admission, DeadlinePassed, RequestLimits, deadline_of
from workers.metrics import FleetMetrics

pytestmark = pytest.mark.anyio


class _Wall:
    """A settable wall clock in epoch milliseconds."""

    def __init__(self) -> None:
        self.ms = 1_000_000.0

    def __call__(self) -> float:
        return self.ms


def _admission(
    inflight: int = 1, age_ms: int = 1_000, factor: int = 1, wall: _Wall | None = None
) -> Admission:
    return Admission(RequestLimits(inflight, age_ms, factor), FleetMetrics(), wall_ms=wall or _Wall())


def _rejected(a: Admission, reason: str) -> float:
    return a._metrics.registry.get_sample_value("ctx_requests_rejected_total", {"reason": reason}) or 0.0


async def _hold(a: Admission, entered: asyncio.Event, leave: asyncio.Event) -> None:
    async with a.slot(None):
        entered.set()
        await leave.wait()


async def test_admission_refuses_at_once_when_slots_and_queue_are_full() -> None:
    a = _admission(inflight=1, factor=1)
    entered, leave = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(a, entered, leave))
    await entered.wait()
    queued = asyncio.create_task(_hold(a, asyncio.Event(), leave))
    await asyncio.sleep(0)  # let it join the queue

    with pytest.raises(Overloaded) as refused:
        async with a.slot(None):
            pass

    assert refused.value.details["reason"] == "queue_full" and refused.value.retry_after_ms >= 50
    assert _rejected(a, "queue_full") == 1
    leave.set()
    await asyncio.gather(holder, queued)


async def test_admission_refuses_a_request_that_queued_longer_than_the_queue_age() -> None:
    a = _admission(inflight=1, age_ms=20, factor=4)
    entered, leave = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(a, entered, leave))
    await entered.wait()

    with pytest.raises(Overloaded) as refused:
        async with a.slot(None):
            pass

    assert refused.value.details["reason"] == "queue_age"
    leave.set()
    await holder
    async with a.slot(None):  # the refused request left no slot taken and no ghost in the queue
        pass


async def test_admission_hands_a_freed_slot_to_the_first_queued_request() -> None:
    a = _admission(inflight=1, factor=4)
    order: list[str] = []
    entered, leave = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(a, entered, leave))
    await entered.wait()

    async def queued(name: str) -> None:
        async with a.slot(None):
            order.append(name)

    first = asyncio.create_task(queued("first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(queued("second"))
    await asyncio.sleep(0)
    leave.set()
    await asyncio.gather(holder, first, second)
    assert order == ["first", "second"]


async def test_admission_a_waiting_request_holds_no_slot_and_returns_ahead_of_new_arrivals() -> None:
    a = _admission(inflight=1, factor=4)
    woken, resumed = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def waiter() -> None:
        async with a.slot(None) as slot:
            async with slot.released():
                await woken.wait()
            order.append("waiter")
            resumed.set()

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    async with a.slot(None):  # the one slot is free while the waiter waits
        woken.set()
        newcomer = asyncio.create_task(_hold(a, asyncio.Event(), resumed))
        await asyncio.sleep(0)
        order.append("other")
    await asyncio.gather(task, newcomer)
    assert order == ["other", "waiter"]


async def test_admission_drops_a_request_whose_deadline_passed_before_it_started() -> None:
    wall = _Wall()
    a = _admission(wall=wall)
    with pytest.raises(DeadlinePassed):
        async with a.slot({DEADLINE_HEADER: str(int(wall.ms) - 1)}):
            raise AssertionError("processed after its deadline")
    assert _rejected(a, "deadline") == 1
    async with a.slot({DEADLINE_HEADER: str(int(wall.ms) + 5_000)}):  # the slot was not leaked
        pass


async def test_admission_drops_a_request_whose_deadline_passed_while_it_queued() -> None:
    wall = _Wall()
    a = _admission(inflight=1, age_ms=10_000, factor=4, wall=wall)
    entered, leave = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(a, entered, leave))
    await entered.wait()

    async def late() -> None:
        async with a.slot({DEADLINE_HEADER: str(int(wall.ms) + 1_000)}):
            raise AssertionError("processed after its deadline")

    task = asyncio.create_task(late())
    await asyncio.sleep(0)
    wall.ms += 2_000
    leave.set()
    with pytest.raises(DeadlinePassed):
        await task
    await holder
    assert _rejected(a, "deadline") == 1


def test_deadline_of_ignores_a_missing_or_malformed_header() -> None:
    assert deadline_of(None) is None
    assert deadline_of({DEADLINE_HEADER: "soon"}) is None
    assert deadline_of({DEADLINE_HEADER: "1700000000000"}) == 1_700_000_000_000
