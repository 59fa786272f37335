"""One agent step in one call (``FleetClient.append_and_prepare``): the publish and the prepare naming
its event go out together, and the reply is the context that includes the event — never one without."""

from __future__ import annotations

import time

import pytest

from ctxfleet_client.client import FleetClient
from contracts.exceptions import (
    EventRejected,
    InvalidRequest,
    NotYetRecorded,
    PayloadTooLarge,
    UnknownModelProfile,
)
from tests.fixtures.builders import Thread, prepare_request

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def test_every_step_returns_the_context_that_includes_its_own_event(fleet, client: FleetClient) -> None:
    t = Thread()
    await client.append(t.system("You fix bugs."))
    seqs: list[int] = []
    for i in range(30):
        step = await client.append_and_prepare(t.user(f"question {i}", key=f"q{i}"), prepare_request(t))
        assert step.prepared.messages[-1].content == f"question {i}"
        assert step.prepared.source_watermark.last_event_key == f"q{i}"
        assert not step.ack.duplicate
        seqs.append(step.ack.stream_seq)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_a_retried_step_is_a_duplicate_publish_answered_with_the_same_context(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.system("You fix bugs."))
    event = t.user("only once", key="once")
    first = await client.append_and_prepare(event, prepare_request(t))
    again = await client.append_and_prepare(event, prepare_request(t))
    assert again.ack.duplicate and again.ack.stream_seq == first.ack.stream_seq
    assert [m.content for m in again.prepared.messages] == [m.content for m in first.prepared.messages]
    assert again.prepared.source_watermark == first.prepared.source_watermark


async def test_a_step_whose_event_is_dead_lettered_raises_event_rejected(fleet, client: FleetClient) -> None:
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    with pytest.raises(EventRejected) as err:
        await client.append_and_prepare(t.outcome("no-such-call", "output", key="k2"), prepare_request(t))
    assert err.value.details["rejected_code"] == "orphan_tool_outcome"


async def test_a_step_whose_publish_fails_raises_that_error_without_waiting_for_the_prepare(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    too_large = t.user("x" * (17 * 1024 * 1024), key="huge")  # over the fleet's 16 MB max_payload
    started = time.monotonic()
    with pytest.raises(PayloadTooLarge):
        await client.append_and_prepare(too_large, prepare_request(t, wait_ms=60_000))
    # The prepare would have waited its whole minute for an event never stored.
    assert time.monotonic() - started < 30


async def test_a_step_whose_prepare_fails_still_stores_its_event_so_a_retry_is_a_duplicate(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    event = t.user("stored anyway", key="k2")
    with pytest.raises(UnknownModelProfile):
        await client.append_and_prepare(event, prepare_request(t, model_profile="no-such-model"))
    retried = await client.append_and_prepare(event, prepare_request(t))
    assert retried.ack.duplicate
    assert retried.prepared.messages[-1].content == "stored anyway"


@pytest.mark.parametrize(
    ("field", "value"),
    [("session_id", "another-session"), ("instance_id", "another"), ("after_event_key", "another-key")],
)
async def test_a_step_whose_prepare_is_not_for_its_event_is_refused_before_anything_is_sent(
    fleet, client: FleetClient, field: str, value: str
) -> None:
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    with pytest.raises(InvalidRequest):
        await client.append_and_prepare(t.user("never sent", key="k2"), prepare_request(t, **{field: value}))
    with pytest.raises(NotYetRecorded):
        await client.prepare(prepare_request(t, after_event_key="k2", wait_ms=300))
