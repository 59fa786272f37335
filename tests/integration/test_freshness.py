"""What a prepare is answered from (services/app/freshness.py), against real servers, with the five
workers in one process and spread over several: never a view older than a commit the runtime had
acknowledged, and notices reach every process over NATS, its own included."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from nats.aio.subscription import Subscription

from contracts.subjects import RECORDED
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread, prepare_request
from tests.fixtures.fleet import eventually
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

StartFleet = Callable[..., Awaitable[Fleet]]
# One process running all five workers, or the recorder apart and two assembler replicas in a queue
# group (a prepare reaches either one).
SHAPES = {
    "one_process": ("recorder,assembler,budgeter,compactor,indexer",),
    "separate_processes": ("recorder,budgeter,compactor,indexer", "assembler", "assembler"),
}


async def _start(start_fleet: StartFleet, shape: str) -> list[Fleet]:
    return [
        await start_fleet(workers=workers, recorder_id=f"fresh-{n}")
        for n, workers in enumerate(SHAPES[shape])
    ]


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_prepare_naming_an_acknowledged_event_never_sees_a_view_older_than_it(
    start_fleet: StartFleet, client: FleetClient, shape: str
) -> None:
    await _start(start_fleet, shape)
    t = Thread()
    await client.append(t.system("You fix bugs."))
    for i in range(20):
        key = f"q{i}"
        if i % 2:
            await client.append(t.user(f"question {i}", key=key))  # acked: stored, not yet recorded
            prepared = await client.prepare(prepare_request(t, after_event_key=key))
        else:
            prepared = (
                await client.append_and_prepare(t.user(f"question {i}", key=key), prepare_request(t))
            ).prepared
        assert prepared.source_watermark.last_event_key == key
        assert prepared.messages[-1].content == f"question {i}"


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_a_prepare_after_another_processs_commit_shows_it_whichever_process_answers(
    start_fleet: StartFleet, client: FleetClient, shape: str
) -> None:
    await _start(start_fleet, shape)
    t = Thread()
    await client.append(t.user("first", key="u1"))
    await client.prepare(prepare_request(t, after_event_key="u1"))
    for _ in range(10):  # every assembler replica has loaded the view at u1 by now
        await client.prepare(prepare_request(t))

    await client.append(t.user("second", key="u2"))
    seen = await client.prepare(prepare_request(t, after_event_key="u2"))
    assert seen.source_watermark.last_event_key == "u2"
    # The runtime has seen u2 committed: no prepare after that, whichever replica serves it and
    # naming no event, is answered from a view before it.
    for _ in range(20):
        prepared = await client.prepare(prepare_request(t))
        assert prepared.source_watermark.last_event_key == "u2"
        assert prepared.messages[-1].content == "second"


def _notices_delivered(fleet: Fleet) -> int:
    """Messages the process's broker delivered to its ``ctx.recorded`` subscribers."""
    assert fleet.broker is not None
    return sum(
        s.subscription.delivered
        for s in fleet.broker.subscribers
        if isinstance(getattr(s, "subscription", None), Subscription)
        and s.subscription.subject.startswith(f"{RECORDED}.")
    )


async def test_a_process_hears_its_own_recorders_notices_over_nats_as_another_process_would(
    start_fleet: StartFleet, client: FleetClient
) -> None:
    (fleet,) = await _start(start_fleet, "one_process")
    before = _notices_delivered(fleet)
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    await client.prepare(prepare_request(t, after_event_key="k1"))

    async def heard() -> bool:
        # One copy each for the assembler, the budgeter and the indexer.
        return _notices_delivered(fleet) == before + 3

    await eventually(heard, what="the recorder's notice delivered to the process's three subscribers")
    await asyncio.sleep(0.2)
    assert _notices_delivered(fleet) == before + 3
