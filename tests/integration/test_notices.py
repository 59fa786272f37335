"""Recorder notices: handed over in-process, never echoed back over NATS, heard from other processes."""

from __future__ import annotations

import asyncio
import json

import nats
from nats.aio.subscription import Subscription
import pytest

from contracts.subjects import RECORDED, recorded_subject
from services.edge.client import FleetClient
from tests.fixtures.builders import Thread, prepare_request
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


def _notices_delivered(fleet) -> int:  # type: ignore[no-untyped-def]
    """Messages the process's broker delivered to its ``ctx.recorded`` subscribers (assembler,
    budgeter, indexer: one copy each per notice)."""
    assert fleet.broker is not None
    return sum(
        s.subscription.delivered
        for s in fleet.broker.subscribers
        if isinstance(getattr(s, "subscription", None), Subscription)
        and s.subscription.subject.startswith(f"{RECORDED}.")
    )


async def test_a_fleet_process_gets_none_of_its_own_notices_back_but_hears_another_processes(
    start_fleet, client: FleetClient, streams: str
) -> None:
    fleet = await start_fleet()  # all five workers, as the embedded default runs them
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    await client.prepare(prepare_request(t, after_event_key="k1"))
    before = _notices_delivered(fleet)
    for n in range(2, 5):
        await client.append(t.user(f"step {n}", key=f"k{n}"))
        # Answered: the recorder handed the commit over in-process.
        await client.prepare(prepare_request(t, after_event_key=f"k{n}"))
    await asyncio.sleep(0.3)  # an echoed copy would have arrived by now
    assert _notices_delivered(fleet) == before

    # Another process's recorder: its notices still reach every subscriber here.
    other = await nats.connect(streams)
    try:
        await other.publish(recorded_subject(t.thread_id), json.dumps({"seq": 4, "revision": 4}).encode())
        await other.flush()

        async def heard() -> bool:
            return _notices_delivered(fleet) == before + 3

        await eventually(heard, what="the other process's notice delivered to the three subscribers")
    finally:
        await other.close()
