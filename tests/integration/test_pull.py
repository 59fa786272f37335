"""Reading a partition leaves no pull request behind on the server (the read-your-writes stall, issue 16)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from workers.pull import available_now, next_batch

pytestmark = [pytest.mark.anyio, pytest.mark.nats]


@pytest.fixture
async def stream(nats_url: str) -> AsyncIterator[tuple[NatsClient, str]]:
    nc = await nats.connect(nats_url)
    name = f"PULL_{uuid.uuid4().hex[:8]}"
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"]))
    try:
        yield nc, name
    finally:
        await js.delete_stream(name)
        await nc.close()


async def _consumer(nc: NatsClient, stream: str) -> nats.js.JetStreamContext.PullSubscription:
    js = nc.jetstream()
    await js.add_consumer(stream, ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.NONE))
    return await js.pull_subscribe_bind(stream=stream, consumer="reader", durable="reader")


async def test_an_event_published_while_idle_is_handed_over_alone_and_no_request_stays_open(
    stream: tuple[NatsClient, str],
) -> None:
    nc, name = stream
    js = nc.jetstream()
    sub = await _consumer(nc, name)
    waiting = asyncio.ensure_future(next_batch(nc, sub, 256, idle_timeout=30.0))
    await asyncio.sleep(0.3)  # idle: the one-message request is lingering on the server
    assert (await js.consumer_info(name, "reader")).num_waiting == 1
    await js.publish(f"{name.lower()}.a", b"one")
    msgs = await asyncio.wait_for(waiting, timeout=10.0)
    assert [m.data for m in msgs] == [b"one"]
    # A fetch of 256 would still hold a request for 255 more, catching the next event until it expires.
    assert (await js.consumer_info(name, "reader")).num_waiting == 0


async def test_what_the_consumer_holds_comes_back_at_once_in_order_without_waiting(
    stream: tuple[NatsClient, str],
) -> None:
    nc, name = stream
    js = nc.jetstream()
    for i in range(5):
        await js.publish(f"{name.lower()}.a", str(i).encode())
    sub = await _consumer(nc, name)
    first = await next_batch(nc, sub, 3, idle_timeout=30.0)
    rest = await available_now(nc, sub, 256)
    assert [m.data for m in first + rest] == [b"0", b"1", b"2", b"3", b"4"]
    assert await available_now(nc, sub, 256) == []
    assert (await js.consumer_info(name, "reader")).num_waiting == 0
    with pytest.raises(TimeoutError):
        await next_batch(nc, sub, 256, idle_timeout=0.3)
