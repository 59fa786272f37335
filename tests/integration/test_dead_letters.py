"""Every bad input is dead-lettered with its reason and raw payload; the recorder keeps serving."""

from __future__ import annotations

import base64
import json

import asyncpg
import nats
import pytest

from contracts import DeadLetter, PrepareRequest
from contracts.subjects import DEAD_STREAM, EVENTS_STREAM, events_subject, msg_id_of
from ctxfleet_client.client import FleetClient
from contracts.exceptions import EventRejected
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

SMALL_LIMIT = 4096  # bytes: small enough that a 5 KiB event exercises payload_too_large


def _bad_inputs(t: Thread, other_session: Thread) -> list[tuple[str, bytes]]:
    return [
        ("unknown_event_kind", t.raw(kind="telepathy", payload={"text": "x"})),
        (
            "invalid_event",
            json.dumps({"kind": "user_input", "session_id": t.session_id, "payload": {"text": "x"}}).encode(),
        ),
        ("payload_too_large", t.raw(kind="user_input", payload={"text": "x" * 5000})),
        ("invalid_encoding", b'{"kind": "user_input", "text": "\xff\xfe"}'),
        ("malformed_json", b'{"kind": "user_input",'),
        (
            "orphan_tool_outcome",
            t.raw(kind="tool_outcome", payload={"call_id": "never-called", "text": "42"}),
        ),
        ("scope_violation", other_session.raw(kind="user_input", payload={"text": "not yours"})),
        ("thread_mismatch", Thread().raw(kind="user_input", payload={"text": "wrong subject"})),
    ]


async def test_each_bad_input_is_dead_lettered_with_reason_and_raw_payload_and_nothing_valid_is_lost(
    start_fleet, client: FleetClient, db: asyncpg.Connection, nats_url: str
) -> None:
    await start_fleet(max_event_bytes=SMALL_LIMIT)
    t = Thread()
    intruder = Thread(session_id="s-intruder", run_id=t.run_id)
    await client.append(t.user("first valid", key="v0"))

    async def owned() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id=$1", t.thread_id))

    # The intruder's session routes to its own partition: let the owner's thread exist first.
    await eventually(owned, what="the owner's first record")
    bad = _bad_inputs(t, intruder)
    for i, (_, raw) in enumerate(bad, start=1):
        await client.append_raw(t.thread_id, f"bad{i}", raw)
        await client.append(t.user(f"valid after bad input {i}", key=f"v{i}"))

    async def all_recorded() -> bool:
        return (
            int(await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id=$1", t.thread_id))
            == len(bad) + 1
        )

    await eventually(all_recorded, what="every valid event")
    keys = [
        r["event_key"]
        for r in await db.fetch(
            "SELECT event_key FROM ctx.records WHERE thread_id=$1 ORDER BY seq", t.thread_id
        )
    ]
    assert keys == [f"v{i}" for i in range(len(bad) + 1)]

    # Bad inputs naming another session (scope violation, thread mismatch) or none route to other
    # partitions than the thread's: their dead letters may commit after its last valid record.
    async def all_dead_lettered() -> bool:
        return int(await db.fetchval("SELECT count(*) FROM ctx.dead_letters")) >= len(bad)

    await eventually(all_dead_lettered, what="every bad input's dead letter")
    codes = [r["code"] for r in await db.fetch("SELECT code FROM ctx.dead_letters ORDER BY stream_seq")]
    assert codes == [code for code, _ in bad]

    # Undecodable bodies name no session and route to their own partition: order by stream seq.
    letters = sorted(await _read_dead_stream(nats_url, len(bad)), key=lambda letter: letter.stream_seq)
    assert [letter.code.value for letter in letters] == [code for code, _ in bad]
    for letter, (_, raw) in zip(letters, bad, strict=True):
        assert letter.reason
        kept = base64.b64decode(letter.raw_base64)
        assert kept == raw[: len(kept)] and letter.raw_size == len(raw)
        assert letter.raw_truncated == (len(raw) > len(kept))


async def test_scope_violation_does_not_reveal_the_owning_session(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    owner = Thread(session_id="s-owner-secret")
    intruder = Thread(session_id="s-intruder", run_id=owner.run_id)
    await client.append(owner.user("mine"))

    async def owned() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id=$1", owner.thread_id))

    await eventually(owned, what="the owner's first record")
    await client.append(intruder.user("claiming it"))
    await eventually(lambda: _dead(db, 1), what="the dead letter")
    row = await db.fetchrow("SELECT code, reason, details::text AS details FROM ctx.dead_letters")
    assert row["code"] == "scope_violation"
    assert "s-owner-secret" not in row["reason"] and "s-owner-secret" not in row["details"]


async def test_duplicate_outcome_and_reused_call_id_and_reused_key_are_rejected(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await client.append(t.assistant(calls=(("c1", "ls", {}),), key="a1"))
    await client.append(t.outcome("c1", "ok", key="o1"))
    await client.append(t.outcome("c1", "second answer", key="o2"))
    await client.append(t.assistant(calls=(("c1", "ls", {}),), key="a2"))
    await client.append_raw(
        t.thread_id, "a1-again", t.user("other content", key="a1").model_dump_json().encode()
    )
    await eventually(lambda: _dead(db, 3), what="three dead letters")
    codes = [r["code"] for r in await db.fetch("SELECT code FROM ctx.dead_letters ORDER BY stream_seq")]
    assert codes == ["duplicate_tool_outcome", "duplicate_call_id", "event_key_conflict"]


async def test_prepare_after_a_rejected_event_answers_event_rejected_at_once(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    await client.append_raw(
        t.thread_id, "k2", t.raw(kind="tool_outcome", event_key="k2", payload={"call_id": "nope"})
    )
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id="main",
        budget_tokens=1000,
        after_event_key="k2",
        wait_ms=5000,
    )
    with pytest.raises(EventRejected) as err:
        await client.prepare(request)
    assert err.value.details["rejected_code"] == "orphan_tool_outcome"


async def test_an_event_whose_msg_id_is_not_derived_from_its_bytes_is_rejected_at_once(
    fleet, client: FleetClient, nats_url: str
) -> None:
    t = Thread()
    original = t.user("the original", key="k1")
    await client.append(original)
    # An id not derived from the bytes (here: the original's, altered so JetStream does not drop it):
    # a publisher deriving ids that way would see later events vanish as "duplicates", so it is told now.
    forged = t.user("forged under a borrowed id", key="k2").model_dump_json().encode()
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().publish(
            events_subject("default", t.session_id, t.thread_id),
            forged,
            stream=EVENTS_STREAM,
            headers={"Nats-Msg-Id": msg_id_of(t.thread_id, "k1", original.model_dump_json().encode()) + "x"},
        )
    finally:
        await nc.close()
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id="main",
        budget_tokens=1000,
        after_event_key="k2",
        wait_ms=5000,
    )
    with pytest.raises(EventRejected) as err:
        await client.prepare(request)
    assert err.value.details["rejected_code"] == "msg_id_mismatch"


async def _dead(db: asyncpg.Connection, n: int) -> bool:
    return int(await db.fetchval("SELECT count(*) FROM ctx.dead_letters")) >= n


async def _read_dead_stream(nats_url: str, n: int) -> list[DeadLetter]:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        sub = await js.subscribe("ctx.dead.>", stream=DEAD_STREAM, ordered_consumer=True)
        letters = []
        for _ in range(n):
            msg = await sub.next_msg(timeout=5)
            letters.append(DeadLetter.model_validate_json(msg.data))
        return letters
    finally:
        await nc.close()


async def test_a_prepare_waiting_on_an_event_that_failed_to_decode_is_told_it_was_rejected_at_once(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.user("first", key="k1"))
    # The key is readable, the rest is not an event (no kind, no payload): dead-lettered under its key.
    broken = json.dumps(
        {"event_key": "k2", "session_id": t.session_id, "run_id": t.run_id, "instance_id": "main"}
    ).encode()
    await client.append_raw(t.thread_id, "k2", broken)
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id="main",
        budget_tokens=1000,
        after_event_key="k2",
        wait_ms=30_000,
    )
    with pytest.raises(EventRejected) as rejected:
        await client.prepare(request, timeout=10.0)  # far below wait_ms: not a timeout answered late
    assert rejected.value.details["event_key"] == "k2" and not rejected.value.retryable
    assert rejected.value.details["rejected_code"] == "unknown_event_kind"
    # A person inspecting the thread sees the refusal itself, not only a count.
    inspection = await client.inspect(t.thread_id)
    (refused,) = inspection.recent_dead_letters
    assert (refused.event_key, refused.code) == ("k2", "unknown_event_kind") and refused.reason
    assert inspection.dead_letters == 1
