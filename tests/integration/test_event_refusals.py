"""A runtime learns at once, through the Python client, that its event will never be recorded: a key
reused for another body, an event published on another thread's subject. The same prepare of a valid
event is answered as always."""

from __future__ import annotations

import time

import asyncpg
import pytest

from ctxfleet_client.client import FleetClient
from contracts.exceptions import EventRejected
from tests.fixtures.builders import Thread, prepare_request
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

# What each prepare could wait for its event; answered after a fraction of it, the answer came at once.
WAIT_MS = 30_000
AT_ONCE_S = 10.0


async def test_a_prepare_naming_a_key_reused_for_another_body_is_rejected_at_once_as_a_key_conflict(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await client.append(t.user("the first question", key="k1"))
    ack = await client.append(t.user("another question under the same key", key="k1"))
    assert not ack.duplicate  # a different body: JetStream stored it, the PubAck says nothing wrong

    started = time.monotonic()
    with pytest.raises(EventRejected) as refused:
        await client.prepare(prepare_request(t, after_event_key="k1", wait_ms=WAIT_MS), timeout=AT_ONCE_S)
    assert time.monotonic() - started < AT_ONCE_S
    assert refused.value.details["rejected_code"] == "event_key_conflict" and not refused.value.retryable

    async def dead_lettered() -> bool:
        code = await db.fetchval("SELECT code FROM ctx.dead_letters WHERE thread_id = $1", t.thread_id)
        return code == "event_key_conflict"

    await eventually(dead_lettered, what="the reused key's dead letter")


async def test_a_step_reusing_a_key_for_another_body_is_rejected_at_once(fleet, client: FleetClient) -> None:
    t = Thread()
    await client.append_and_prepare(t.user("the first question", key="k1"), prepare_request(t))

    started = time.monotonic()
    with pytest.raises(EventRejected) as refused:
        await client.append_and_prepare(
            t.user("a second question, same key", key="k1"),
            prepare_request(t, wait_ms=WAIT_MS),
            timeout=AT_ONCE_S,
        )
    assert time.monotonic() - started < AT_ONCE_S
    assert refused.value.details["rejected_code"] == "event_key_conflict"


async def test_a_prepare_on_the_thread_an_event_names_is_rejected_at_once_when_it_went_to_another_subject(
    fleet, client: FleetClient
) -> None:
    subject_thread = Thread()
    body_thread = Thread(session_id=subject_thread.session_id)
    await client.append(subject_thread.user("the thread the subject names", key="s1"))
    misfiled = body_thread.user("published on the other thread's subject", key="w1")
    await client.append_raw(subject_thread.thread_id, "w1", misfiled.model_dump_json().encode())

    for thread in (body_thread, subject_thread):
        started = time.monotonic()
        with pytest.raises(EventRejected) as refused:
            await client.prepare(
                prepare_request(thread, after_event_key="w1", wait_ms=WAIT_MS), timeout=AT_ONCE_S
            )
        assert time.monotonic() - started < AT_ONCE_S
        assert refused.value.details["rejected_code"] == "thread_mismatch" and not refused.value.retryable


async def test_a_prepare_naming_a_valid_event_is_answered_with_it(fleet, client: FleetClient) -> None:
    t = Thread()
    await client.append(t.user("the first question", key="k1"))
    prepared = await client.prepare(prepare_request(t, after_event_key="k1", wait_ms=WAIT_MS))
    assert prepared.messages[-1].content == "the first question"

    step = await client.append_and_prepare(t.user("a follow-up", key="k2"), prepare_request(t))
    assert step.prepared.messages[-1].content == "a follow-up"
    assert step.prepared.source_watermark.last_event_key == "k2"
    # A retried step is the same body under the same key: a duplicate, answered as before.
    again = await client.append_and_prepare(t.user("a follow-up", key="k2"), prepare_request(t))
    assert again.ack.duplicate and again.prepared.messages[-1].content == "a follow-up"


async def test_a_prepare_naming_the_first_key_of_an_event_that_repeats_its_key_is_rejected_at_once(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.user("the first question", key="k1"))
    body = t.user("which key is mine?", key="e2").model_dump_json()
    repeated = body[:-1] + ', "event_key": "e7"}'  # JSON that names two keys: neither may win
    # The dead letter is filed under the first key the bytes spell (the one a reader of them sees).
    await client.append_raw(t.thread_id, "e2", repeated.encode())

    started = time.monotonic()
    with pytest.raises(EventRejected) as refused:
        await client.prepare(prepare_request(t, after_event_key="e2", wait_ms=WAIT_MS), timeout=AT_ONCE_S)
    assert time.monotonic() - started < AT_ONCE_S
    assert refused.value.details["rejected_code"] == "invalid_event" and not refused.value.retryable
    assert "event_key" in refused.value.message
