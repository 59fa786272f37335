"""Request/reply endpoints answered from tasks of their own (workers/responder.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import cast

import pytest
from faststream.nats import NatsResponse
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry, Counter

from services.settings import Settings
from workers.admission import DeadlinePassed
from workers.compose import reply_rule
from workers.replies import Inbound, ReplyRule
from workers.responder import Responder

pytestmark = pytest.mark.anyio


class _Published:
    """The publishing half of a NATS client: what was sent where."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str] | None]] = []

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self.sent.append((subject, payload, headers))


def _responder(max_tasks: int = 4) -> tuple[Responder, _Published]:
    nc = _Published()
    return Responder(lambda: cast(NatsClient, nc), max_tasks), nc


def _request(n: int, reply: str = "") -> Inbound:
    return Inbound(str(n).encode(), "ctx.prepare.t.r.i", {}, reply or f"_INBOX.x.{n}")


async def test_each_request_is_answered_once_on_its_reply_subject_with_its_headers() -> None:
    responder, nc = _responder()

    async def echo(message: Inbound) -> NatsResponse:
        return NatsResponse(message.body, headers={"ctx-status": "ok"})

    endpoint = responder.serving(echo)
    for n in range(3):
        await endpoint.take(_request(n))
    await responder.answered()
    assert sorted(nc.sent) == [(f"_INBOX.x.{n}", str(n).encode(), {"ctx-status": "ok"}) for n in range(3)]


async def test_a_handler_that_raises_is_answered_with_a_typed_internal_error() -> None:
    responder, nc = _responder()

    async def broken(message: Inbound) -> NatsResponse:
        raise RuntimeError("boom")

    await responder.serving(broken).take(_request(1))
    await responder.answered()
    [(subject, body, headers)] = nc.sent
    assert subject == "_INBOX.x.1"
    assert headers == {"ctx-status": "error"}
    assert json.loads(body)["code"] == "internal_error"


async def test_a_request_whose_caller_is_gone_and_one_without_a_reply_subject_get_no_answer() -> None:
    responder, nc = _responder()

    async def late(message: Inbound) -> NatsResponse:
        if message.body == b"1":
            raise DeadlinePassed("the caller's deadline passed")
        return NatsResponse(b"{}", headers={"ctx-status": "ok"})

    endpoint = responder.serving(late)
    await endpoint.take(_request(1))
    await endpoint.take(Inbound(b"2", "ctx.prepare.t.r.i", {}, ""))
    await responder.answered()
    assert nc.sent == []


async def test_requests_beyond_the_bound_wait_until_one_in_hand_is_answered() -> None:
    responder, nc = _responder(max_tasks=2)
    release = asyncio.Event()

    async def slow(message: Inbound) -> NatsResponse:
        await release.wait()
        return NatsResponse(message.body, headers={"ctx-status": "ok"})

    endpoint = responder.serving(slow)
    await endpoint.take(_request(1))
    await endpoint.take(_request(2))
    third = asyncio.create_task(endpoint.take(_request(3)))
    await asyncio.sleep(0.05)
    assert not third.done()  # two in hand: the consume loop waits, as behind max_workers
    assert responder.in_hand == 2
    release.set()
    await asyncio.wait_for(third, timeout=1.0)
    await responder.answered()
    assert len(nc.sent) == 3


async def test_answered_waits_for_every_request_taken() -> None:
    responder, nc = _responder()

    async def slow(message: Inbound) -> NatsResponse:
        await asyncio.sleep(0.05)
        return NatsResponse(message.body, headers={"ctx-status": "ok"})

    await responder.serving(slow).take(_request(1))
    assert nc.sent == []
    await asyncio.wait_for(responder.answered(), timeout=1.0)
    assert [s for s, _, _ in nc.sent] == ["_INBOX.x.1"]
    assert responder.in_hand == 0


def _guarded(named_users: bool) -> tuple[Responder, _Published, Callable[[str, str], float | None]]:
    nc, registry = _Published(), CollectorRegistry()
    refused = Counter("ctx_replies_refused", "", ["endpoint", "reason"], registry=registry)
    responder = Responder(
        lambda: cast(NatsClient, nc), 4, replies=ReplyRule(named_users=named_users), refused=refused
    )

    def count(endpoint: str, reason: str) -> float | None:
        return registry.get_sample_value(
            "ctx_replies_refused_total", {"endpoint": endpoint, "reason": reason}
        )

    return responder, nc, count


async def test_a_request_whose_reply_is_not_an_inbox_is_dropped_unhandled_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    responder, nc, refused = _guarded(named_users=False)
    handled: list[bytes] = []

    async def handler(message: Inbound) -> NatsResponse:
        handled.append(message.body)
        return NatsResponse(b"{}", headers={"ctx-status": "ok"})

    endpoint = responder.serving(handler, name="prepare", tenant_at=2)
    for n, reply in enumerate(("ctx.events.default.s.r.main", "$JS.API.STREAM.PURGE.CTX_EVENTS", "_INBOXx")):
        await endpoint.take(Inbound(str(n).encode(), "ctx.prepare.acme.r.main", {}, reply))
    # An open bus: any inbox is the requester's, as far as the fleet can tell.
    await endpoint.take(Inbound(b"ok", "ctx.prepare.acme.r.main", {}, "_INBOX.abc.1"))
    await responder.answered()
    assert handled == [b"ok"] and [s for s, _, _ in nc.sent] == ["_INBOX.abc.1"]
    assert refused("prepare", "not_an_inbox") == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "ctx.prepare.acme.r.main" in warnings[0], warnings
    assert "ctx.events.default.s.r.main" in warnings[0]


async def test_on_a_bus_of_named_users_only_a_requesters_own_inbox_is_answered() -> None:
    responder, nc, refused = _guarded(named_users=True)

    async def handler(message: Inbound) -> NatsResponse:
        return NatsResponse(message.body, headers={"ctx-status": "ok"})

    prepare = responder.serving(handler, name="prepare", tenant_at=2)
    inspect = responder.serving(handler, name="inspect", tenant_at=2)
    for reply in (
        "_INBOX.runtime-acme.a.1",
        "_INBOX.operator.b.1",
        "_INBOX.runtime-default.c.1",
        "_INBOX.x.1",
    ):
        await prepare.take(Inbound(b"p", "ctx.prepare.acme.r.main", {}, reply))
    # Only the operator may inspect: the tenant's own runtime inbox is not a requester's there.
    for reply in ("_INBOX.runtime-acme.d.1", "_INBOX.operator.e.1"):
        await inspect.take(Inbound(b"i", "ctx.inspect.acme.r.main", {}, reply))
    await responder.answered()
    assert sorted(s for s, _, _ in nc.sent) == [
        "_INBOX.operator.b.1",
        "_INBOX.operator.e.1",
        "_INBOX.runtime-acme.a.1",
    ]
    assert refused("prepare", "foreign_inbox") == 2 and refused("inspect", "foreign_inbox") == 1


def test_the_reply_rule_names_users_when_the_fleet_connects_with_a_user_name() -> None:
    assert reply_rule(Settings(nats_user="fleet", nats_password="pw"), ("nats://h:4222",)).named_users
    assert reply_rule(Settings(), ("nats://h2:4222", "nats://assembler:pw@h:4222")).named_users
    # A token, nkeys, JWTs or no authentication at all: the fleet cannot tell one inbox from another.
    assert not reply_rule(Settings(nats_token="t"), ("nats://h:4222",)).named_users
    assert not reply_rule(Settings(), ("nats://h:4222",)).named_users
