"""What a runtime or a starting worker meets while a replicated stream elects a new leader: typed,
retryable errors, and one log line per refused server instead of a traceback."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError

from infra import runtime
from infra.runtime import Servers, fleet_prerequisites
from ctxfleet_client.client import FleetClient, log_nats_error
from contracts.exceptions import FleetUnavailable
from services.settings import Settings
from tests.fixtures.builders import Thread

pytestmark = pytest.mark.anyio


class _ElectingStream:
    """JetStream as a client sees it between a leader's death and the next election: 503 on publish."""

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        raise NoStreamResponseError

    async def consumer_info(self, *args: Any, **kwargs: Any) -> None:
        raise NatsTimeout


class _Connection:
    max_payload = 1024 * 1024
    is_connected = True
    is_closed = False

    def jetstream(self, timeout: float) -> _ElectingStream:
        return _ElectingStream()

    async def close(self) -> None:
        pass


async def test_append_while_the_stream_elects_a_leader_is_fleet_unavailable_and_retryable() -> None:
    client = FleetClient(_Connection())  # type: ignore[arg-type]
    with pytest.raises(FleetUnavailable, match="NoStreamResponseError") as caught:
        await client.append(Thread().user("hello", key="e1"))
    assert caught.value.retryable


async def test_a_refused_server_is_logged_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ctxfleet.nats"):
        await log_nats_error(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 4222)"))
    [record] = caplog.records
    assert (
        record.getMessage()
        == "NATS: ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', 4222)"
    )
    assert record.exc_info is None


async def test_a_worker_starting_while_the_jobs_consumer_elects_a_leader_waits_as_for_an_unavailable_fleet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def connected(*args: Any, **kwargs: Any) -> _Connection:
        return _Connection()

    async def current(*args: Any) -> None:
        return None

    monkeypatch.setattr(runtime, "connect_nats", connected)
    monkeypatch.setattr(runtime, "require_current_schema", current)
    # FleetUnavailable is what CTX_STARTUP_WAIT_S waits out; a bare timeout stopped the worker.
    with pytest.raises(FleetUnavailable, match="did not answer about the compactor consumer"):
        await fleet_prerequisites(
            Settings(workers="compactor"), Servers(("nats://127.0.0.1:1",), "postgresql://x")
        )
