"""Streams and the broker: partitioning computed by the server, version checks, safe re-provisioning."""

from __future__ import annotations

import socket

import nats
import pytest

from contracts.subjects import EVENTS_STREAM, partition_of
from infra.provision import ProvisionError, check_server, provision_streams
from services.client import FleetClient
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import TEST_PARTITIONS

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
            assert msg.subject == f"ctx.p.{partition}.{t.session_id}.{t.thread_id}"
    finally:
        await nc.close()


async def test_provision_is_idempotent_and_refuses_a_new_partition_count_unless_forced(streams: str) -> None:
    nc = await nats.connect(streams)
    try:
        again = await provision_streams(nc, partitions=TEST_PARTITIONS)
        assert (again.events, again.dead) == ("unchanged", "unchanged")
        with pytest.raises(ProvisionError, match="partitioned 4 ways"):
            await provision_streams(nc, partitions=8)
        forced = await provision_streams(nc, partitions=8, force=True)
        assert forced.events == "updated"
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
        assert "partition(8,1)" in (info.config.subject_transform.dest or "")  # type: ignore[union-attr]
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
        version = nc._server_info["version"]
        if tuple(int(x) for x in version.split(".")[:2]) >= (2, 10):
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
