"""Streams and the broker: partitioning computed by the server, version checks, safe re-provisioning."""

from __future__ import annotations

import socket
from dataclasses import replace

import nats
import pytest
from nats.js.api import SubjectTransform

from contracts.subjects import EVENTS_STREAM, partition_of
from infra.provision import ProvisionError, check_server, provision_streams
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import TEST_PARTITIONS, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.nats]


async def test_server_partitions_sessions_exactly_as_partition_of_predicts(streams: str) -> None:
    async with await FleetClient.connect(streams) as client:
        threads = [Thread() for _ in range(40)]
        for t in threads:
            await client.append(t.user("x"))
    nc = await nats.connect(streams)
    try:
        js = nc.jetstream()
        for seq, t in enumerate(threads, start=1):
            msg = await js.get_msg(EVENTS_STREAM, seq)
            partition = partition_of(t.session_id, partitions=TEST_PARTITIONS)
            assert msg.subject == f"ctx.p.{partition}.default.{t.session_id}.{t.thread_id}"
    finally:
        await nc.close()


async def test_provision_is_idempotent_and_refuses_a_new_partition_count_unless_forced(streams: str) -> None:
    nc = await nats.connect(streams)
    try:
        js = nc.jetstream()
        consumer_before = await js.consumer_info("CTX_JOBS", "compactor")
        again = await provision_streams(nc, partitions=TEST_PARTITIONS)
        assert (again.events, again.dead, again.jobs) == ("unchanged", "unchanged", "unchanged")
        consumer_after = await js.consumer_info("CTX_JOBS", "compactor")
        assert (
            consumer_after.config == consumer_before.config
            and consumer_after.created == consumer_before.created
        )
        with pytest.raises(ProvisionError, match="partitioned 4 ways"):
            await provision_streams(nc, partitions=8)
        forced = await provision_streams(nc, partitions=8, force=True)
        assert forced.events == "updated"
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
        assert "partition(8,2)" in (info.config.subject_transform.dest or "")  # type: ignore[union-attr]
    finally:
        await nc.close()


async def test_events_stored_before_tenancy_are_recorded_as_the_default_tenants_after_the_upgrade(
    streams: str,
    start_fleet,
    db,  # type: ignore[no-untyped-def]
) -> None:
    """A stream provisioned by an older build (no tenant token) is reconciled in place, and what it holds
    unrecorded is still recorded — nothing valid is lost to the upgrade."""
    nc = await nats.connect(streams)
    try:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM)
        old_src = "ctx.events.*.*.*"
        old_dest = (
            f"ctx.p.{{{{partition({TEST_PARTITIONS},1)}}}}"
            ".{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}"
        )
        await js.update_stream(
            replace(
                info.config,
                subjects=[old_src],
                subject_transform=SubjectTransform(src=old_src, dest=old_dest),
            )
        )
        t = Thread()
        await js.publish(
            f"ctx.events.{t.session_id}.{t.thread_id}",
            t.user("from before the upgrade").model_dump_json().encode(),
        )
        upgraded = await provision_streams(nc, partitions=TEST_PARTITIONS)
        assert upgraded.events == "updated"
        info = await js.stream_info(EVENTS_STREAM)
        assert info.config.subjects == ["ctx.events.*.*.*.*"]
    finally:
        await nc.close()
    await start_fleet()

    async def recorded() -> bool:
        return (
            await db.fetchval("SELECT tenant FROM ctx.sessions WHERE session_id = $1", t.session_id)
            == "default"
        )

    await eventually(recorded, timeout=15, what="the pre-upgrade event to be recorded")


async def test_provision_asks_for_a_cluster_when_replicas_exceed_the_servers(streams: str) -> None:
    nc = await nats.connect(streams)
    try:
        with pytest.raises(
            ProvisionError, match="CTX_STREAM_REPLICAS=3 needs a JetStream cluster of at least 3 servers"
        ):
            await provision_streams(nc, partitions=TEST_PARTITIONS, replicas=3)
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
        assert info.config.num_replicas == 1  # refused, not half-applied
    finally:
        await nc.close()


def _debian_nats_listening() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 4222), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _debian_nats_listening(), reason="no system nats-server on 127.0.0.1:4222")
async def test_check_server_refuses_a_server_older_than_2_10_with_a_clear_message() -> None:
    nc = await nats.connect("nats://127.0.0.1:4222")
    try:
        version = nc.connected_server_version
        if (version.major, version.minor) >= (2, 10):
            pytest.skip(f"system nats-server is {version}, new enough")
        with pytest.raises(ProvisionError, match=r"needs nats-server >= 2\.10.*runs 2\.9"):
            await check_server(nc)
    finally:
        await nc.close()


async def test_check_server_accepts_the_embedded_server(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        assert (await check_server(nc)).startswith("2.")
    finally:
        await nc.close()


def test_ctxfleet_provision_twice_changes_nothing_the_second_time(streams: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(CTX_NATS_URL=streams, CTX_PARTITIONS=str(TEST_PARTITIONS), CTX_DATA_DIR=str(tmp_path))
    root = Path(__file__).resolve().parents[2]
    runs = [
        subprocess.run(
            [sys.executable, "-m", "infra.cli", "provision"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    assert (
        runs[1].stdout.strip()
        == "streams provisioned: events unchanged, dead letters unchanged, jobs unchanged"
    )
    refused = subprocess.run(
        [sys.executable, "-m", "infra.cli", "provision"],
        cwd=root,
        env={**env, "CTX_PARTITIONS": "8"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--force" in refused.stderr and "Traceback" not in refused.stderr
