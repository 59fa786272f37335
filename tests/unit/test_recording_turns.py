"""The recorder shares its event loop with prepares: planning a large batch gives the loop turns."""

from __future__ import annotations

import asyncio

import pytest

import services.app.recording as recording
from services.app.recording import RecordingService
from services.core.ledger import RecordingLimits
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming


class _Sink:
    async def publish(self, letter: object, msg_id: str) -> None:
        return None


async def _turns_while_recording(events: int) -> tuple[int, int]:
    """Loop turns another task got while a batch of ``events`` was recorded, and the records made."""
    store = MemoryStore()
    t = Thread()
    batch = incoming([t.system(), *(t.user(f"question {i}") for i in range(events - 1))])
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = turns
    recorder = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit")
    result = await recorder.record_batch(0, batch)
    other.cancel()
    return turns - before, result.recorded


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("slice_s", "gives_a_turn_per_event"),
    [(0.0, True), (3600.0, False)],
    ids=["a-slice-per-event", "one-slice-for-the-batch"],
)
async def test_planning_a_batch_gives_other_work_on_the_loop_a_turn_after_each_slice(
    monkeypatch: pytest.MonkeyPatch, slice_s: float, gives_a_turn_per_event: bool
) -> None:
    monkeypatch.setattr(recording, "_PLAN_SLICE_S", slice_s)
    turns, recorded = await _turns_while_recording(200)
    assert recorded == 200
    assert (turns >= 200) is gives_a_turn_per_event
