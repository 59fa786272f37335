"""Recorder notices: handed over in-process, never echoed back over NATS, heard from other processes."""

from __future__ import annotations

import asyncio
import json

import nats
from nats.aio.subscription import Subscription
import pytest

from contracts.subjects import RECORDED, recorded_subject
from services.app.recording import BatchResult, RecordingService
from services.core.ledger import Incoming
from services.store.ledger import RecordsRepo
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


async def test_a_prepare_on_a_thread_its_own_recorder_holds_waits_for_the_batch_without_asking_the_ledger(
    start_fleet, client: FleetClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = await start_fleet()
    t = Thread()
    await client.append(t.user("first", key="u1"))
    await client.prepare(prepare_request(t, after_event_key="u1"))

    gate = asyncio.Event()
    record_batch = RecordingService.record_batch

    async def held(
        self: RecordingService, partition: int, batch: list[Incoming], *, committed: int | None = None
    ) -> BatchResult:
        await gate.wait()  # the recorder has taken the batch and not yet written it
        return await record_batch(self, partition, batch, committed=committed)

    checks: list[str] = []
    find_event_outcome = RecordsRepo.find_event_outcome

    async def counted(conn: object, tenant: str, thread_id: str, event_key: str) -> object:
        checks.append(event_key)
        return await find_event_outcome(conn, tenant, thread_id, event_key)  # type: ignore[arg-type]

    monkeypatch.setattr(RecordingService, "record_batch", held)
    monkeypatch.setattr(RecordsRepo, "find_event_outcome", staticmethod(counted))
    await client.append(t.user("second", key="u2"))

    async def held_by_the_recorder() -> bool:
        return bool(fleet.recorder._local.is_recording(t.thread_id))

    await eventually(held_by_the_recorder, what="the recorder holding the batch")
    waiting = asyncio.create_task(client.prepare(prepare_request(t, after_event_key="u2", wait_ms=10_000)))
    await asyncio.sleep(0.15)  # under the waiter's re-check interval (0.25 s), which would ask anyway
    assert not waiting.done() and checks == []

    gate.set()
    prepared = await asyncio.wait_for(waiting, timeout=10)
    assert prepared.source_watermark.last_event_key == "u2"
    assert checks == []  # answered from the recorder's handover alone
