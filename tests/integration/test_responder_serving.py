"""A serving responder takes its requests from nats-py subscriptions of its own, on a real server.

FastStream's consume pipeline (parser, middlewares, dependency injection) was 0.2–0.4 ms of every
prepare, so request/reply endpoints are subscribed by the responder itself; a
responder without a connection only declares them for the AsyncAPI document. These tests hold the
serving path to the same promises: answered on the caller's inbox, shared by the queue group, every
delivered request answered through a drain, and no endpoint declared once serving has begun.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from faststream.nats import NatsResponse, NatsRouter
from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from workers.replies import Inbound
from workers.responder import Responder

pytestmark = [pytest.mark.anyio, pytest.mark.nats]


@pytest.fixture
async def clients(nats_url: str) -> AsyncIterator[tuple[NatsClient, NatsClient]]:
    serving, asking = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        yield serving, asking
    finally:
        await serving.close()
        await asking.close()


def _echo_tokens(responder: Responder, router: NatsRouter, prefix: str, queue: str = "q") -> None:
    @responder.endpoint(router, f"{prefix}.{{tenant}}.{{thread}}", queue=queue, title="t")
    async def echo(message: Inbound) -> NatsResponse:
        tenant, thread = message.tokens(2)
        return NatsResponse(
            f"{tenant}/{thread}/{message.body.decode()}".encode(), headers={"ctx-status": "ok"}
        )


async def test_a_serving_responder_answers_on_the_callers_inbox_from_a_subscription_of_its_own(
    clients: tuple[NatsClient, NatsClient],
) -> None:
    serving, asking = clients
    prefix = f"t{uuid.uuid4().hex[:8]}"
    responder, router = Responder(lambda: serving, 4), NatsRouter()
    _echo_tokens(responder, router, prefix)
    assert not router.subscribers, "served by the responder, not declared on FastStream"
    assert responder.subjects == (f"{prefix}.*.*",)
    await responder.start()
    reply = await asking.request(f"{prefix}.acme.x", b"hi", timeout=5)
    assert reply.data == b"acme/x/hi" and reply.headers == {"ctx-status": "ok"}
    await responder.drain()


async def test_two_responders_in_one_queue_group_share_the_requests(
    clients: tuple[NatsClient, NatsClient], nats_url: str
) -> None:
    serving, asking = clients
    other = await nats.connect(nats_url)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    counts = {"a": 0, "b": 0}
    responders = []
    for name, nc in (("a", serving), ("b", other)):
        responder = Responder(lambda nc=nc: nc, 4)

        @responder.endpoint(NatsRouter(), f"{prefix}.{{x}}", queue="shared", title="t")
        async def count(message: Inbound, name: str = name) -> NatsResponse:
            counts[name] += 1
            return NatsResponse(b"ok", headers={"ctx-status": "ok"})

        await responder.start()
        responders.append(responder)
    try:
        for n in range(40):
            assert (await asking.request(f"{prefix}.{n}", b"", timeout=5)).data == b"ok"
        # Each request answered once, by one member of the group; both members served.
        assert sum(counts.values()) == 40 and min(counts.values()) > 0
    finally:
        for responder in responders:
            await responder.drain()
        await other.close()


async def test_a_drain_answers_every_request_delivered_and_takes_no_more(
    clients: tuple[NatsClient, NatsClient],
) -> None:
    serving, asking = clients
    prefix = f"t{uuid.uuid4().hex[:8]}"
    responder, release, taken = Responder(lambda: serving, 8), asyncio.Event(), asyncio.Event()

    @responder.endpoint(NatsRouter(), f"{prefix}.{{n}}", queue="q", title="t")
    async def slow(message: Inbound) -> NatsResponse:
        if responder.in_hand == 3:
            taken.set()
        await release.wait()
        return NatsResponse(message.body, headers={"ctx-status": "ok"})

    await responder.start()
    asked = [
        asyncio.create_task(asking.request(f"{prefix}.{n}", str(n).encode(), timeout=10)) for n in range(3)
    ]
    await asyncio.wait_for(taken.wait(), 5)
    drained = asyncio.create_task(responder.drain())
    await asyncio.sleep(0.2)
    assert not drained.done(), "a drain waits for the requests it took"
    release.set()
    await asyncio.wait_for(drained, 5)
    assert sorted(r.data for r in await asyncio.gather(*asked)) == [b"0", b"1", b"2"]
    with pytest.raises((NoRespondersError, NatsTimeout)):
        await asking.request(f"{prefix}.9", b"", timeout=0.5)


async def test_an_endpoint_declared_after_the_responder_started_is_an_error(
    clients: tuple[NatsClient, NatsClient],
) -> None:
    serving, _ = clients
    responder = Responder(lambda: serving, 4)
    await responder.start()
    with pytest.raises(RuntimeError, match="declared after the responder started"):
        _echo_tokens(responder, NatsRouter(), f"t{uuid.uuid4().hex[:8]}")
    await responder.drain()


def test_a_responder_without_a_connection_declares_its_endpoints_for_the_document() -> None:
    responder, router = Responder(None, 4), NatsRouter()
    _echo_tokens(responder, router, "ctx.example")
    assert [s.subject.broker_address for s in router.subscribers] == ["ctx.example.*.*"]
    assert responder.subjects == ()
