"""An id that cannot be a subject token is refused by the client at once, on a real server.

A NATS server closes the connection of a client whose subject overruns its protocol line: a
5,000-character session id used to cost the caller a 10 s timeout and a reconnect.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import pytest

from contracts.branches import ExportRequest
from contracts.subjects import MAX_SUBJECT_LENGTH, MAX_TOKEN_LENGTH, check_subject, tenant_subject
from ctxfleet_client.client import FleetClient
from contracts.exceptions import InvalidRequest
from tests.fixtures.builders import Thread

pytestmark = [pytest.mark.anyio, pytest.mark.nats]

LONG = "s" * 5_000


def test_subject_builders_refuse_tokens_and_subjects_past_their_bounds() -> None:
    assert len(tenant_subject("ctx.read", "t" * MAX_TOKEN_LENGTH)) < MAX_SUBJECT_LENGTH
    with pytest.raises(ValueError, match="5000 characters"):
        tenant_subject("ctx.read", "t" * 5_000)
    with pytest.raises(ValueError, match="at most 1024"):
        check_subject("ctx." + "a." * 600)


async def test_client_refuses_an_overlong_or_unsafe_id_at_once_and_its_connection_stays_usable(
    client: FleetClient,
) -> None:
    thread = Thread()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: client.inspect_session(LONG),
        lambda: client.export_page(LONG, ExportRequest()),
        lambda: client.inspect(f"{LONG}.main"),
        lambda: client.append_raw(thread.thread_id, "k1", b"{}", session_id=LONG),
        # A newline would end the protocol line early; a dot or wildcard would change the subject.
        lambda: client.inspect_session("s1\n"),
        lambda: client.inspect_session("s1.>"),
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(InvalidRequest):
            await call()
        assert time.monotonic() - started < 1.0  # refused before anything was sent
    ack = await client.append(thread.user("the same connection still works"))
    assert ack.stream_seq > 0 and not ack.duplicate
