"""NATS restarted under a running fleet and client: typed fast failures, truthful readiness, recovery."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts import PrepareRequest
from infra.embedded import EmbeddedNats
from ctxfleet_client.client import FleetClient
from contracts.exceptions import CtxError, FleetUnavailable
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually, make_settings, reset_streams
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


@pytest.fixture
def own_nats() -> Iterator[EmbeddedNats]:
    """A nats-server of this test alone, so restarting it disturbs no other test."""
    root = Path(tempfile.mkdtemp(prefix="ctx-natsdown-"))
    server = EmbeddedNats(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _request(t: Thread) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, model_profile="gpt-4o"
    )


async def test_client_keeps_working_across_a_nats_restart_and_fails_fast_while_it_is_down(
    own_nats: EmbeddedNats, database_url: str, tmp_path: Path
) -> None:
    url = own_nats.url
    await reset_streams(url)
    fleet = Fleet(
        make_settings(url, database_url, tmp_path, workers="recorder,assembler"),
        nats_urls=(url,),
        database_url=database_url,
    )
    await fleet.start()
    client = await FleetClient.connect(url, reconnect_wait_s=0.2)
    try:
        t = Thread()
        await client.append(t.user("before the restart", key="k1"))
        await client.prepare(_request(t).model_copy(update={"after_event_key": "k1"}))

        await asyncio.to_thread(own_nats.stop)

        async def client_disconnected() -> bool:
            return not client._nc.is_connected

        await eventually(client_disconnected, what="the client to notice the server is gone")
        started = time.monotonic()
        with pytest.raises(FleetUnavailable):
            await client.prepare(_request(t), timeout=10.0)
        with pytest.raises(FleetUnavailable):
            await client.append(t.user("during the outage", key="k2"))
        assert time.monotonic() - started < 1.0, (
            "requests while disconnected must fail fast, not wait out the timeout"
        )

        async def readiness_names_nats() -> bool:
            checks = await fleet.readiness()
            return all(checks[name] is not None for name in ("nats", "broker", "consumers"))

        await eventually(
            readiness_names_nats, what="readiness to name NATS in every check that depends on it"
        )

        await asyncio.to_thread(own_nats.start)  # same port, same JetStream store

        async def served() -> bool:
            try:
                await client.append(t.user("after the restart", key="k3"))
                prepared = await client.prepare(
                    _request(t).model_copy(update={"after_event_key": "k3"}), timeout=2.0
                )
            except CtxError:
                return False
            return prepared.source_watermark.last_event_key == "k3"

        await eventually(served, timeout=30.0, what="the same client served again after the restart")

        async def ready() -> bool:
            checks = await fleet.readiness()
            return all(checks[name] is None for name in ("nats", "broker", "consumers"))

        await eventually(ready, timeout=30.0, what="readiness ok again")
    finally:
        await client.close()
        await fleet.stop()
