"""The recorder's fetch hands an event over as soon as it is stored and leaves no pull request behind.

An event published while the recorder idles in ``fetch(256, timeout)`` must reach it at once: a fetch
that kept a half-filled request open on the server and waited for the rest of its batch would hold
every prepare waiting for that event (``after_event_key``) up to a whole timeout — a read-your-writes
stall that grows with the agent's think time (issue 16). nats-py (>= 2.16, as pinned) and the
supported servers behave; this guards the pinned range and the servers against a regression.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

pytestmark = [pytest.mark.anyio, pytest.mark.nats]

# The recorder's batch and idle timeout (workers/recorder.py); long, so a wait for the rest would show.
BATCH, TIMEOUT_S = 256, 20.0


@pytest.fixture
async def stream(nats_url: str) -> AsyncIterator[tuple[NatsClient, str]]:
    nc = await nats.connect(nats_url)
    name = f"PULL_{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"]))
    await js.add_consumer(name, ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.NONE))
    try:
        yield nc, name
    finally:
        await js.delete_stream(name)
        await nc.close()


async def test_an_event_published_while_the_recorder_idles_is_handed_over_alone_with_no_request_left(
    stream: tuple[NatsClient, str],
) -> None:
    nc, name = stream
    js = nc.jetstream()
    sub = await js.pull_subscribe_bind(stream=name, consumer="reader", durable="reader")
    waiting = asyncio.ensure_future(sub.fetch(BATCH, timeout=TIMEOUT_S))
    await asyncio.sleep(0.3)  # idle: the fetch's request is waiting on the server
    await js.publish(f"{name.lower()}.a", b"one")
    published = time.monotonic()
    msgs = await asyncio.wait_for(waiting, timeout=TIMEOUT_S + 5)
    handed_over = time.monotonic() - published
    assert [m.data for m in msgs] == [b"one"]
    # Not the rest of a 20 s timeout (the bound is loose on purpose: the failure mode is seconds).
    assert handed_over < TIMEOUT_S / 4, handed_over
    assert (await js.consumer_info(name, "reader")).num_waiting == 0


async def test_what_the_consumer_holds_comes_back_in_order_and_an_idle_fetch_times_out(
    stream: tuple[NatsClient, str],
) -> None:
    nc, name = stream
    js = nc.jetstream()
    for i in range(5):
        await js.publish(f"{name.lower()}.a", str(i).encode())
    sub = await js.pull_subscribe_bind(stream=name, consumer="reader", durable="reader")
    first = await sub.fetch(3, timeout=TIMEOUT_S)
    rest = await sub.fetch(BATCH, timeout=TIMEOUT_S)
    assert [m.data for m in first + rest] == [b"0", b"1", b"2", b"3", b"4"]
    assert (await js.consumer_info(name, "reader")).num_waiting == 0
    with pytest.raises(TimeoutError):
        await sub.fetch(BATCH, timeout=0.3)
