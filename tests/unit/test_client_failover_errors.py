"""What a runtime meets while a replicated stream elects a new leader: typed, retryable errors, and
one log line per refused server instead of a traceback."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from nats.js.errors import NoStreamResponseError

from services.edge.client import FleetClient, log_nats_error
from services.errors import FleetUnavailable
from tests.fixtures.builders import Thread

pytestmark = pytest.mark.anyio


class _ElectingStream:
    """JetStream as a client sees it between a leader's death and the next election: 503 on publish."""

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        raise NoStreamResponseError


class _Connection:
    max_payload = 1024 * 1024
    is_connected = True
    is_closed = False

    def jetstream(self, timeout: float) -> _ElectingStream:
        return _ElectingStream()


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
