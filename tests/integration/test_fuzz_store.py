"""Fuzzed batches through the real store: every event is recorded or dead-lettered, once,
and the batch never stalls."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from contracts import DeadLetter
from services.core.ledger import Incoming, RecordingLimits
from services.app.recording import RecordingService
from services.store.postgres import PgStore
from tests.unit.test_fuzz_events import encode_body, event_bodies

pytestmark = [pytest.mark.pg]


class _Sink:
    def __init__(self) -> None:
        self.letters: dict[str, DeadLetter] = {}

    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        self.letters.setdefault(msg_id, letter)


def _batch(bodies: list[dict[str, Any]]) -> list[Incoming]:
    """The bodies as one partition's fetched batch, in a session and run of their own."""
    session_id, run_id = f"s-{uuid.uuid4().hex[:10]}", f"r-{uuid.uuid4().hex[:10]}"
    # A plain opening question starts the session's run, so later fuzzed events can be recorded too.
    opener = {
        "kind": "user_input",
        "event_key": "k-opener",
        "instance_id": "main",
        "payload": {"text": "start"},
    }
    out = []
    for seq, body in enumerate([opener, *bodies], start=1):
        body = {**body, "session_id": session_id, "run_id": run_id}
        out.append(Incoming(f"ctx.p.0.{session_id}.{run_id}.main", encode_body(body), seq))
    return out


async def _record_and_account(database_url: str, batch: list[Incoming]) -> tuple[int, int]:
    """Record the batch, check the store against the result; (events accounted for, batch size)."""
    consumer = f"fuzz-{uuid.uuid4().hex[:10]}"
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        sink = _Sink()
        service = RecordingService(
            PgStore(pool), sink, limits=RecordingLimits(), recorder_id="fuzz", consumer=consumer
        )
        result = await service.record_batch(0, batch)
        for rejection in result.rejections:
            event(f"dead-lettered: {rejection.code.value}")
        event("recorded some" if result.recorded else "recorded none")
        async with pool.acquire() as conn:
            thread_id = batch[0].subject.split(".", 4)[4]
            seqs = [
                r["stream_seq"]
                for r in await conn.fetch(
                    "SELECT stream_seq FROM ctx.records WHERE thread_id=$1 ORDER BY seq", thread_id
                )
            ]
            assert seqs == sorted(seqs) and len(seqs) == result.recorded
            dead = {r.incoming.stream_seq for r in result.rejections}
            assert not dead & set(seqs)
            stored = await conn.fetchval(
                "SELECT count(*) FROM ctx.dead_letters WHERE stream_seq = ANY($1::bigint[]) "
                "AND subject = ANY($2::text[])",
                sorted(dead),
                sorted({m.subject for m in batch}),
            )
            assert stored == len(dead) == len(sink.letters)
            position = await conn.fetchval(
                "SELECT last_stream_seq FROM ctx.tracking WHERE consumer=$1", consumer
            )
            assert position == batch[-1].stream_seq
        again = await service.record_batch(0, batch)
        assert (again.recorded, again.rejections, again.skipped) == (0, (), len(batch))
        for letter in sink.letters.values():
            json.loads(letter.model_dump_json())
        return result.recorded + len(result.rejections) + result.duplicates, len(batch)
    finally:
        await pool.close()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(event_bodies(), min_size=1, max_size=6))
def test_record_batch_of_fuzzed_events_records_or_dead_letters_each_exactly_once(
    database_url: str, bodies: list[dict[str, Any]]
) -> None:
    accounted, size = asyncio.run(_record_and_account(database_url, _batch(bodies)))
    # Each event went exactly one way: a record, a dead letter, or a duplicate of an earlier one.
    assert accounted == size
