"""Stopping an assembler answers every request a concurrent subscriber already took."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from workers.app import _handled

pytestmark = pytest.mark.anyio


class _Subscriber:
    """What a FastStream ``max_workers`` subscriber holds: worker slots and an in-memory queue."""

    def __init__(self, workers: int) -> None:
        self.max_workers = workers
        self.limiter = anyio.Semaphore(workers)
        self.send_stream, self.receive_stream = anyio.create_memory_object_stream[bytes](
            max_buffer_size=workers
        )


async def test_draining_waits_until_queued_and_running_requests_are_answered() -> None:
    sub = _Subscriber(4)
    answered: list[bytes] = []
    await sub.send_stream.send(b"queued")

    async def worker() -> None:
        async with sub.limiter:
            msg = await sub.receive_stream.receive()
            await asyncio.sleep(0.05)  # computing the answer
            answered.append(msg)

    running = asyncio.create_task(worker())
    await asyncio.sleep(0)
    await asyncio.wait_for(_handled(sub), timeout=2.0)
    assert answered == [b"queued"]  # stopping the broker now cancels nothing that was taken
    await running
    sub.send_stream.close()
    sub.receive_stream.close()


async def test_a_plain_subscriber_needs_no_wait() -> None:
    # Nothing to poll (no worker slots, no queue): it returns at once rather than timing out here.
    assert await asyncio.wait_for(_handled(object()), timeout=0.5) is None
