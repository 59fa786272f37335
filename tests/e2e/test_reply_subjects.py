"""An answer goes only to the requester's inbox: no identity can aim the fleet's publishes elsewhere.

A request names its reply subject freely, and the fleet's NATS users may answer on any reply subject
(``allow_responses``). So each endpoint is asked, by an identity allowed to ask it, to answer into
another tenant's events stream, into the JetStream API (a purge of the events stream), onto a notice
subject and into another tenant's inbox, on the embedded closed bus as ``make run`` starts it (its
generated users, the fleet as ``fleet``). Nothing may arrive anywhere; each refusal is counted. The
same request with the requester's own inbox, sent after them, is answered: its answer bounds the wait.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.client import Client as NatsClient

from contracts import JOBS_STREAM, CompactionJob, PrepareRequest
from contracts.identities import OPERATOR, inbox_prefix, requesters, runtime_user
from contracts.subjects import DEAD_STREAM, EVENTS_STREAM, recorded_subject
from infra.asyncapi import CHANNELS, Channel
from infra.credentials import load_credentials
from infra.runtime import Servers, start_fleet, start_servers
from ctxfleet_client.client import FleetClient
from services.settings import Settings
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually, make_settings
from tests.fixtures.servers import with_database
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.nats, pytest.mark.pg]

ATTACKER = "acme"
VICTIM = "default"
# Every request the fleet answers: the AsyncAPI document's request channels, which
# tests/unit/test_schemas.py holds to every subject the workers subscribe (and the test below to
# what the responder serves), so a new endpoint is attacked here without being listed here.
REQUESTS = tuple(c for c in CHANNELS if c.action == "receive" and c.replies)


@dataclass
class ClosedFleet:
    settings: Settings
    servers: Servers
    fleet: Fleet
    victim: Thread

    async def connect(self, user: str) -> NatsClient:
        creds = load_credentials(self.settings.embedded.data_dir)
        assert creds is not None
        return await nats.connect(
            list(self.servers.nats_urls),
            user=user,
            password=creds.password(user),
            inbox_prefix=inbox_prefix(user),
            name=f"test-{user}",
        )

    def refused(self) -> dict[tuple[str, str], float]:
        """``ctx_replies_refused_total`` by (endpoint, reason)."""
        return {
            (s.labels["endpoint"], s.labels["reason"]): s.value
            for metric in self.fleet.metrics.registry.collect()
            for s in metric.samples
            if s.name == "ctx_replies_refused_total"
        }


@pytest.fixture(scope="module")
async def closed(
    pg_server_url: str, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ClosedFleet]:
    """One fleet for the module, as `make run` runs it, with a victim thread of tenant ``default``."""
    name = f"ctx_t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_server_url)
    try:
        await conn.execute(f"CREATE DATABASE {name} TEMPLATE {pg_template}")
    finally:
        await conn.close()
    tmp: Path = tmp_path_factory.mktemp("replies")
    settings = make_settings(
        None,  # type: ignore[arg-type]
        with_database(pg_server_url, name),
        tmp,
        tenants=f"{VICTIM},{ATTACKER}",
    )
    servers = await asyncio.to_thread(start_servers, settings)
    try:
        fleet = await start_fleet(settings, servers)
        try:
            victim = Thread()
            creds = load_credentials(settings.embedded.data_dir)
            assert creds is not None
            user = runtime_user(VICTIM)
            async with await FleetClient.connect(
                servers.nats_urls, user=user, password=creds.password(user), tenant=VICTIM
            ) as client:
                await client.append(victim.system())
                last = victim.user("hello")
                await client.append(last)
                # Recorded, so a reply stored in its partition would be dead-lettered in its session.
                await client.prepare(
                    PrepareRequest(
                        session_id=victim.session_id,
                        run_id=victim.run_id,
                        instance_id=victim.instance_id,
                        after_event_key=last.event_key,
                        budget_tokens=4_000,
                    )
                )
            yield ClosedFleet(settings, servers, fleet, victim)
        finally:
            await fleet.stop()
    finally:
        await asyncio.to_thread(servers.stop)
        conn = await asyncpg.connect(pg_server_url)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close()


def _subject(channel: Channel, run_id: str) -> str:
    values = {"tenant": ATTACKER, "run_id": run_id, "instance_id": "main", "session_id": "s-attacker"}
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], channel.address)


class _Watch:
    """Subscriptions that must receive nothing, flushed so whatever the server routed has arrived."""

    def __init__(self) -> None:
        self.received: list[tuple[str, bytes]] = []
        self._clients: list[NatsClient] = []

    async def on(self, nc: NatsClient, subject: str) -> None:
        async def got(msg: Any) -> None:
            self.received.append((msg.subject, msg.data))

        await nc.subscribe(subject, cb=got)
        await nc.flush()
        self.own(nc)

    def own(self, nc: NatsClient) -> None:
        """Close ``nc`` with the watch."""
        self._clients.append(nc)

    async def close(self) -> None:
        for nc in self._clients:
            await nc.close()

    async def flush(self) -> None:
        for nc in self._clients:
            await nc.flush()


async def _stored(provisioner: NatsClient) -> tuple[int, int]:
    js = provisioner.jetstream()
    events, dead = await js.stream_info(EVENTS_STREAM), await js.stream_info(DEAD_STREAM)
    return events.state.messages, dead.state.messages


@pytest.mark.parametrize("channel", REQUESTS, ids=lambda c: c.key)
async def test_each_endpoint_answers_only_the_requesters_inbox_never_a_stream_the_jetstream_api_or_a_notice(
    closed: ClosedFleet, channel: Channel
) -> None:
    subject = _subject(channel, f"r-{uuid.uuid4().hex[:10]}")
    # The attacker is an identity the server lets send this request: the tenant's runtime where its
    # grants allow, else the operator (inspection and export are the operator's alone).
    allowed = requesters(subject, ATTACKER)
    attacker = runtime_user(ATTACKER) if runtime_user(ATTACKER) in allowed else OPERATOR
    victim = closed.victim
    targets = (
        f"ctx.events.{VICTIM}.{victim.session_id}.{victim.run_id}.{victim.instance_id}",
        f"$JS.API.STREAM.PURGE.{EVENTS_STREAM}",
        recorded_subject(victim.thread_id),
    )
    trap = f"{inbox_prefix(runtime_user(VICTIM))}.trap-{uuid.uuid4().hex[:8]}"
    asking, provisioner = await closed.connect(attacker), await closed.connect("provisioner")
    watch = _Watch()
    await watch.on(await closed.connect("fleet"), targets[2])
    await watch.on(await closed.connect(runtime_user(VICTIM)), f"{trap}.>")
    try:
        before, refused_before = await _stored(provisioner), closed.refused()
        for reply in (*targets, f"{trap}.1"):
            await asking.publish(subject, b"{}", reply=reply)
        # The same request on the requester's own inbox, sent after them, is answered (with a typed
        # error for the empty body, or the reply): the fleet has taken and settled the others by then.
        answer = await asking.request(subject, b"{}", timeout=10)
        assert answer.headers is not None and answer.headers.get("ctx-status") in ("ok", "error")
        await watch.flush()
        assert watch.received == []
        # Nothing stored in another tenant's partition (so nothing dead-lettered there), nothing purged.
        assert await _stored(provisioner) == before
        moved = {k: v - refused_before.get(k, 0.0) for k, v in closed.refused().items()}
        moved = {k: v for k, v in moved.items() if v}
        endpoints = {endpoint for endpoint, _ in moved}
        assert len(endpoints) == 1, moved
        (endpoint,) = endpoints
        assert moved == {(endpoint, "not_an_inbox"): 3.0, (endpoint, "foreign_inbox"): 1.0}
    finally:
        watch.own(asking)
        watch.own(provisioner)
        await watch.close()


async def test_the_fleet_serves_exactly_the_request_channels_and_only_through_its_responder(
    closed: ClosedFleet,
) -> None:
    responder = closed.fleet.responder
    assert responder is not None
    wildcards = {re.sub(r"\{\w+\}", "*", c.address) for c in REQUESTS}
    assert sorted(responder.subjects) == sorted(wildcards)
    broker = closed.fleet.broker
    assert broker is not None
    # FastStream answers a message's reply subject unless told not to; none of its subscribers may.
    assert [repr(s) for s in broker.subscribers if not s._no_reply] == []


async def test_a_notice_or_a_job_carrying_a_reply_subject_is_never_answered(closed: ClosedFleet) -> None:
    # The fleet's own identity sends notices and jobs (the recorder's and the budgeter's, in a
    # deployment with one user per worker): none may steer another worker's publishes.
    victim = closed.victim
    sender, provisioner = await closed.connect("fleet"), await closed.connect("provisioner")
    watch = _Watch()
    # A forged notice about the victim's thread, which would wake its prepares (any subject within
    # the answering worker's own grants could be aimed at).
    target = recorded_subject(victim.thread_id)
    await watch.on(await closed.connect("fleet"), target)
    try:
        before = await _stored(provisioner)
        other = Thread()
        await sender.publish(recorded_subject(other.thread_id), b"{}", reply=target)
        await sender.publish(f"ctx.compacted.{other.thread_id}", b"{}", reply=target)
        job = CompactionJob(
            job_id=f"j-{uuid.uuid4().hex}",
            thread_id=other.thread_id,
            session_id=other.session_id,
            watermark=1,
            view_revision=0,
            policy_name="default",
            policy_revision=1,
            input_budget=4_000,
            reasons=("manual",),
        )
        js = sender.jetstream()
        await js.publish(
            "ctx.compaction.jobs",
            job.model_dump_json().encode(),
            stream=JOBS_STREAM,
            headers={"Nats-Msg-Id": job.job_id, "reply_to": target},
        )
        await sender.flush()
        # The job taken and settled, then a request answered after the notices bounds the wait.
        await eventually(lambda: _queued(provisioner, 0), timeout=20.0, what="the compactor taking the job")
        operator = await closed.connect(OPERATOR)
        watch.own(operator)
        answer = await operator.request(
            f"ctx.session.inspect.{VICTIM}.{victim.session_id}", b"{}", timeout=10
        )
        assert json.loads(answer.data)["type"] == "session_inspection"
        await watch.flush()
        assert watch.received == []
        assert await _stored(provisioner) == before
    finally:
        watch.own(sender)
        watch.own(provisioner)
        await watch.close()


async def _queued(provisioner: NatsClient, jobs: int) -> bool:
    """Whether the compaction work queue holds ``jobs`` jobs (a taken job leaves it once acknowledged)."""
    return (await provisioner.jetstream().stream_info(JOBS_STREAM)).state.messages == jobs
