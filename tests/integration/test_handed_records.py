"""What a recorder hands its process's loader is what PostgreSQL gives back: every
record of every bundled sample, recorded one event per batch, rebuilt from the plan exactly as a load
reads it, and every head as stored."""

from __future__ import annotations

import uuid

import pytest

from services.app.recording import RecordingService
from services.core.ledger import RecordingLimits
from services.core.records import LedgerRecord
from services.store.connect import create_pool
from services.store.postgres import PgStore
from tests.fixtures.builders import incoming, sample_trace_events

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


class _Sink:
    async def publish(self, letter: object, msg_id: str) -> None:
        pass  # a sample's invalid input (none expected) is not what this test is about


def _as_read(r: LedgerRecord) -> tuple[object, ...]:
    mask = r.mask_tokens
    return (
        r.seq,
        r.thread_id,
        r.thread_seq,
        r.event_key,
        r.kind,
        r.payload,
        r.text,
        r.tokens.o200k_base,
        r.tokens.cl100k_base,
        r.mask_text,
        (mask.o200k_base, mask.cl100k_base) if mask else None,
        r.recorded_at,
    )


async def test_the_records_and_heads_a_recorder_hands_over_are_those_the_store_returns(
    database_url: str,
) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=2)
    store = PgStore(pool)
    service = RecordingService(
        store, _Sink(), limits=RecordingLimits(), recorder_id="handed", consumer=f"handed-{uuid.uuid4().hex}"
    )
    compared = advances = 0
    try:
        for seq, event in enumerate(sample_trace_events(f"s-handed-{uuid.uuid4().hex[:8]}"), start=1):
            result = await service.record_batch(0, incoming([event], start_seq=seq))
            for thread_id, advance in result.advances.items():
                advances += 1
                async with store.session() as s:
                    head = await s.select_head(thread_id)
                    assert head is not None
                    assert (head.revision, head.last_seq, head.last_hash, head.last_event_key) == (
                        advance.head.revision,
                        advance.head.last_seq,
                        advance.head.last_hash,
                        advance.head.last_event_key,
                    )
                    handed = advance.ledger_records()
                    if handed is None:
                        continue  # a text kept only in a blob: not handed over
                    first = advance.records[0].seq
                    stored = await s.select_records(thread_id, gt=first - 1, lte=head.last_seq)
                assert [_as_read(r) for r in handed] == [_as_read(r) for r in stored]
                compared += len(handed)
    finally:
        await pool.close()

    # Most of a trace is a known thread's messages, calls and outcomes: one statement, handed over.
    assert compared > 300 and advances > 300, (compared, advances)
