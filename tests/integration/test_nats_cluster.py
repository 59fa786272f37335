"""A 3-node JetStream cluster on loopback: CTX_NATS_URL's comma-separated URLs reach every server,
credentials written in one of them serve for all, and provisioning keeps CTX_STREAM_REPLICAS copies."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contracts import JOBS_STREAM
from contracts.subjects import DEAD_STREAM, EVENTS_STREAM
from infra.nats_cluster import NatsCluster
from infra.runtime import provision
from ctxfleet_client.client import FleetClient
from services.settings import Settings
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.nats]

USER = "fleet"


@pytest.fixture(scope="module")
def password() -> str:
    return secrets.token_hex(12)


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory, password: str) -> AsyncIterator[NatsCluster]:
    """Three routed nodes that admit one user only, so a server reached without credentials refuses."""
    nodes = NatsCluster(
        tmp_path_factory.mktemp("cluster"),
        size=3,
        extra_config=f'authorization {{ users: [ {{ user: "{USER}", password: "{password}" }} ] }}',
    )
    await asyncio.to_thread(nodes.start)
    try:
        yield nodes
    finally:
        await asyncio.to_thread(nodes.stop)


def _with_credentials(url: str, password: str) -> str:
    return url.replace("nats://", f"nats://{USER}:{password}@", 1)


async def test_nats_cluster_start_names_every_node_once_and_keeps_its_ports_for_the_next_start(
    cluster: NatsCluster,
) -> None:
    assert len(set(cluster.urls)) == 3 and all(cluster.healthy(i) for i in range(3))
    assert [cluster.node_named(cluster.server_name(i)) for i in range(3)] == [0, 1, 2]
    # The same folder again: the ports written down on the first start, so clients keep their URLs.
    clients, _, _ = NatsCluster(cluster.data_dir, size=3)._ports()
    assert clients == [node.port for node in cluster.nodes]


async def test_client_given_every_url_with_credentials_in_one_moves_to_another_node_when_its_own_dies(
    cluster: NatsCluster, password: str
) -> None:
    first, *others = cluster.urls
    # As CTX_NATS_URL would say it: one string, whitespace around the commas, credentials in one URL.
    servers = " , ".join([_with_credentials(first, password), *others])
    async with await FleetClient.connect(servers, max_reconnect_attempts=-1, reconnect_wait_s=0.1) as client:
        nc = client._nc
        node = [n.port for n in cluster.nodes].index(nc.connected_url.port)
        await asyncio.to_thread(cluster.kill, node)
        try:

            async def elsewhere() -> bool:
                return nc.is_connected and nc.connected_url.port != cluster.nodes[node].port

            # Any node but the dead one, with the credentials of the first URL: the others carry none,
            # and a server reached without them refuses the connection.
            await eventually(elsewhere, timeout=30, what="the client to reconnect to another node")
            await nc.flush(timeout=5)
            live = {n.port for i, n in enumerate(cluster.nodes) if i != node}
            assert nc.connected_url.port in live and nc.stats["reconnects"] >= 1
        finally:
            await asyncio.to_thread(cluster.start_node, node)

            async def rejoined() -> bool:
                return await asyncio.to_thread(cluster.healthy, node)

            await eventually(rejoined, timeout=60, what="the killed node to rejoin")


async def test_provision_keeps_stream_replicas_copies_of_every_stream_one_on_each_node(
    cluster: NatsCluster, password: str, tmp_path: Path
) -> None:
    urls = (_with_credentials(cluster.urls[0], password), *cluster.urls[1:])
    settings = Settings(nats_url=urls, stream_replicas=3, partitions=4, data_dir=tmp_path)
    assert settings.bus.nats_url is not None
    await provision(settings.bus.nats_url, settings)
    async with await FleetClient.connect(settings.bus.nats_url) as client:
        js = client._nc.jetstream(timeout=10.0)
        for stream in (EVENTS_STREAM, DEAD_STREAM, JOBS_STREAM):
            info = await js.stream_info(stream)
            assert info.config.num_replicas == 3 and info.cluster is not None
            peers = {info.cluster.leader, *(peer.name for peer in info.cluster.replicas or ())}
            assert peers == {cluster.server_name(i) for i in range(3)}, stream
