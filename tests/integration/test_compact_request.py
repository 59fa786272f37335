"""``ctx.compact``: a manual compaction over real NATS and Postgres, answered by the compactor."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from contracts import CompactRequest, PrepareRequest
from ctxfleet_client.client import FleetClient
from contracts.exceptions import CompactionFailed, NothingToCompact, PermissionDenied, ThreadNotFound
from tests.fixtures.builders import Thread
from tests.integration.test_tenants import TwoTenants, two_tenants  # noqa: F401  (the closed bus)

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def _recorded(client: FleetClient, t: Thread, after: str) -> None:
    # Read-your-writes: the prepare returns once the ledger holds ``after``.
    await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            model_profile="gpt-4o",
            after_event_key=after,
        )
    )


async def _thread_with_groups(client: FleetClient, n: int) -> Thread:
    t = Thread()
    await client.append(t.system("You fix bugs in a Python repository."))
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    for i in range(n):
        await client.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat f{i}.py"}),)))
        await client.append(t.outcome(f"c{i}", f"contents of f{i}.py " * 80, key=f"out{i}"))
    await _recorded(client, t, f"out{n - 1}" if n else "task")
    return t


def _compact(t: Thread) -> CompactRequest:
    return CompactRequest(run_id=t.run_id, instance_id=t.instance_id, session_id=t.session_id)


@pytest.fixture
async def other_tenant(streams: str) -> AsyncIterator[FleetClient]:
    c = await FleetClient.connect(streams, tenant="other")
    yield c
    await c.close()


async def test_compact_request_commits_a_summary_and_reports_tokens_before_and_after(
    fleet, client: FleetClient
) -> None:
    # The default policy (gpt-4o, 128k) never triggers on six small groups: only the request compacts.
    t = await _thread_with_groups(client, 6)

    reply = await client.compact(_compact(t))

    assert reply.thread_id == t.thread_id and reply.view_revision == 1
    assert 0 < reply.tokens_after < reply.tokens_before
    prepared = await client.prepare(
        PrepareRequest(
            session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, model_profile="gpt-4o"
        )
    )
    assert prepared.summary is not None
    assert (prepared.summary.summary_id, prepared.summary.covered_to) == (reply.summary_id, reply.covered_to)
    assert prepared.view_revision == reply.view_revision
    inspection = await client.inspect(t.thread_id, limit=1)
    assert inspection.summaries == 1


async def test_compact_request_twice_in_a_row_says_nothing_to_compact(fleet, client: FleetClient) -> None:
    def counted(outcome: str) -> float:
        sample = fleet.metrics.registry.get_sample_value("ctx_manual_compactions_total", {"outcome": outcome})
        return sample or 0.0

    committed, refused_before = counted("committed"), counted("nothing_to_compact")
    t = await _thread_with_groups(client, 6)
    await client.compact(_compact(t))

    with pytest.raises(NothingToCompact) as refused:
        await client.compact(_compact(t))

    assert refused.value.details["thread_id"] == t.thread_id
    assert counted("committed") == committed + 1
    assert counted("nothing_to_compact") == refused_before + 1


async def test_compact_request_keeps_the_recent_groups_so_a_short_thread_has_nothing_to_compact(
    fleet, client: FleetClient
) -> None:
    t = await _thread_with_groups(client, 2)  # the default policy keeps the two newest groups

    with pytest.raises(NothingToCompact):
        await client.compact(_compact(t))


async def test_compact_request_for_another_tenants_thread_looks_like_a_missing_one(
    fleet, client: FleetClient, other_tenant: FleetClient
) -> None:
    t = await _thread_with_groups(client, 6)
    missing = Thread()

    with pytest.raises(ThreadNotFound) as foreign:
        await other_tenant.compact(CompactRequest(run_id=t.run_id, instance_id=t.instance_id))
    with pytest.raises(ThreadNotFound) as absent:
        await other_tenant.compact(CompactRequest(run_id=missing.run_id, instance_id=missing.instance_id))

    assert foreign.value.message.replace(t.thread_id, "X") == absent.value.message.replace(
        missing.thread_id, "X"
    )
    assert (await client.inspect(t.thread_id, limit=1)).summaries == 0


async def test_compact_request_naming_another_session_looks_like_a_missing_thread(
    fleet, client: FleetClient
) -> None:
    t = await _thread_with_groups(client, 6)

    with pytest.raises(ThreadNotFound):
        await client.compact(
            CompactRequest(run_id=t.run_id, instance_id=t.instance_id, session_id="someone-else")
        )


async def test_compact_request_reports_compaction_failed_when_the_summarizer_cannot_be_reached(
    start_fleet, client: FleetClient
) -> None:
    # Port 9 (discard) refuses connections: the summarizer fails at once with a transport error.
    await start_fleet(summarizer="openai", summarizer_base_url="http://127.0.0.1:9/v1", summarizer_model="m")
    t = await _thread_with_groups(client, 6)

    with pytest.raises(CompactionFailed) as failed:
        await client.compact(_compact(t))

    assert failed.value.details["thread_id"] == t.thread_id
    assert (await client.inspect(t.thread_id, limit=1)).summaries == 0


async def test_compact_request_on_the_closed_bus_is_a_runtimes_for_its_own_tenant_only(
    two_tenants: TwoTenants,
) -> None:
    acme = await two_tenants.client("runtime-acme", "acme")
    # globex's identity naming acme's subjects: the server refuses it.
    impostor = await two_tenants.client("runtime-globex", "acme")
    globex = await two_tenants.client("runtime-globex", "globex")
    try:
        t = await _thread_with_groups(acme, 6)
        with pytest.raises(PermissionDenied):
            await impostor.compact(_compact(t))
        with pytest.raises(ThreadNotFound):
            await globex.compact(_compact(t))

        reply = await acme.compact(_compact(t))
    finally:
        for c in (acme, impostor, globex):
            await c.close()

    assert reply.tokens_after < reply.tokens_before
    violations = two_tenants.violations()
    # The one refusal is the impostor's: the compactor subscribed and answered under the fleet's grants.
    assert violations and all("ctx.compact.acme." in v for v in violations), violations
