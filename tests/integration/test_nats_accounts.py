"""NATS accounts: every worker runs under its own user with only its subjects, and nothing needs more."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from contracts import ContextPolicy, SearchRequest
from infra import SAMPLES_DIR
from infra.embedded import EmbeddedNats
from infra.nats_accounts import authorization_conf, grants
from infra.runtime import provision
from ctxfleet_client.client import FleetClient
from services.edge.replay import ReplayOptions, replay_trace
from services.settings import WORKER_NAMES
from services.core.trace import read_trace
from tests.fixtures.fleet import eventually, make_settings
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.nats, pytest.mark.pg]

SAMPLE = SAMPLES_DIR / "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl"


@dataclass
class SecuredNats:
    url: str
    passwords: dict[str, str]
    log: Path

    def violations(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if "Violation" in line]


@pytest.fixture
async def secured_nats(tmp_path: Path) -> AsyncIterator[SecuredNats]:
    """A NATS server whose only users are the fleet's, with the grants of infra.nats_accounts."""
    users = grants(("acme",))
    passwords = {user: secrets.token_hex(12) for user in users}
    server = EmbeddedNats(
        tmp_path / "nats", extra_config=authorization_conf(lambda user: json.dumps(passwords[user]), users)
    )
    url = await asyncio.to_thread(server.start)
    try:
        yield SecuredNats(url, passwords, tmp_path / "nats" / "nats.log")
    finally:
        await asyncio.to_thread(server.stop)


async def test_each_worker_under_its_own_user_replays_a_trace_with_compaction_and_no_violation(
    secured_nats: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    pw = secured_nats.passwords
    provisioner = make_settings(
        secured_nats.url, database_url, tmp_path, nats_user="provisioner", nats_password=pw["provisioner"]
    )
    await provision((secured_nats.url,), provisioner)
    fleets: list[Fleet] = []
    try:
        for worker in WORKER_NAMES:
            settings = make_settings(
                secured_nats.url,
                database_url,
                tmp_path,
                workers=worker,
                nats_user=worker,
                nats_password=pw[worker],
                recorder_id=f"acct-{worker}",
            )
            fleet = Fleet(settings, nats_urls=(secured_nats.url,), database_url=database_url)
            fleets.append(fleet)
            await fleet.start()
        for fleet in fleets:
            assert all(v is None for v in (await fleet.readiness()).values()), await fleet.readiness()

        # The replay reports compactions by inspecting the thread: the CLI's (operator's) identity.
        async with await FleetClient.connect(
            secured_nats.url, user="operator", password=pw["operator"]
        ) as client:
            # A small budget, so the budgeter enqueues and the compactor pulls, acks and announces.
            policy = ContextPolicy(name="accounts-3000", model_profile=None, budget_tokens=3000)
            await client.register_policy(policy)
            report = await replay_trace(
                client, read_trace(SAMPLE), ReplayOptions(session_id="acct-s1", policy=policy.name)
            )

            async def indexed() -> bool:
                hits = await client.search(SearchRequest(session_id="acct-s1", query="marshmallow"))
                return bool(hits.hits)

            async def compacted() -> bool:
                # The budgeter and compactor work behind the replay: a fast replay can end before the
                # first summary commits, so wait for it rather than read the replay's final count.
                session = await client.inspect_session("acct-s1")
                threads = [t.thread_id for run in session.runs for t in run.threads]
                return sum([(await client.inspect(t, limit=1)).summaries for t in threads]) >= 1

            await eventually(compacted, timeout=20.0, what="a summary committed by the compactor's user")
            await eventually(indexed, timeout=20.0, what="the indexer's user indexing the session")
        assert report.totals["errors"] == 0 and report.totals["over_budget"] == 0
        assert isinstance(report.totals["compactions"], int)
        # The gauges use the JetStream API too (queue depth, oldest job, consumer lag).
        for fleet in fleets:
            await fleet.export_backlogs()
    finally:
        for fleet in fleets:
            await fleet.stop()
    assert secured_nats.violations() == []


async def test_a_runtime_cannot_bypass_partitioning_or_pose_as_the_assembler(
    secured_nats: SecuredNats,
) -> None:
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(
        secured_nats.url,
        user="runtime-acme",
        password=secured_nats.passwords["runtime-acme"],
        error_cb=on_error,
        inbox_prefix="_INBOX.runtime-acme",
    )
    try:
        # Straight into a partition (skipping the server's transform), and answering prepares.
        await nc.publish("ctx.p.0.acme.s1.r1.main", b"{}")
        await nc.subscribe("ctx.prepare.>")
        # Inspecting a thread's ledger or a session's principals is the operator's, not a runtime's.
        await nc.publish("ctx.inspect.acme.r1.main", b"{}")
        await nc.publish("ctx.session.inspect.acme.s1", b"{}")
        await nc.flush()
        with pytest.raises((NoRespondersError, NatsTimeout)):
            await nc.request("$JS.API.STREAM.DELETE.CTX_EVENTS", b"", timeout=1.0)
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
    assert any("permissions violation" in str(e).lower() for e in errors)
    logged = "\n".join(secured_nats.violations())
    assert "ctx.p.0.acme.s1.r1.main" in logged and "ctx.prepare.>" in logged and "STREAM.DELETE" in logged
    assert "ctx.inspect.acme.r1.main" in logged and "ctx.session.inspect.acme.s1" in logged


async def test_a_wrong_password_fails_at_connect_without_echoing_it(secured_nats: SecuredNats) -> None:
    from contracts.exceptions import FleetUnavailable

    with pytest.raises(FleetUnavailable) as caught:
        await FleetClient.connect(
            secured_nats.url, user="runtime-acme", password="not-the-password", tenant="acme"
        )
    assert "not-the-password" not in str(caught.value)
