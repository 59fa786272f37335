"""The recorder counts o200k only; a record's cl100k count is made when a profile first needs it
— with the same result as counting both at recording, on both stores.

Checked over every record of the bundled sample traces (long outputs cut to head and tail, failed
outputs, tool calls with JSON arguments, run ends), against ``count_record`` of both encodings.
"""

from __future__ import annotations

from typing import Any

import pytest

from contracts import Event
from services.core.ledger import batch_keys
from services.core.ledger import (
    RecordingLimits,
    _rendered_calls,  # the recorder's own rendering of an event's calls
    decode_batch,
    plan_batch,
)
from services.core.render import content_of, count_record
from services.core.tokens import ENCODINGS, TokenCounter, counter_for
from tests.fixtures.builders import incoming, sample_trace_events

pytestmark = pytest.mark.anyio

LIMITS = RecordingLimits()
Store = Any


class _Spy(TokenCounter):
    """A real cl100k counter that remembers how often it was asked."""

    def __init__(self) -> None:
        super().__init__("cl100k_base")
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return super().count(text)


def _eager(events: list[Event]) -> dict[str, tuple[int, int]]:
    """What counting both encodings at recording gave, per event key (text as the recorder kept it)."""
    counters = {n: counter_for(n) for n in ENCODINGS}
    decoded = decode_batch(incoming(events), LIMITS)
    plan = plan_batch(decoded, _no_reads(decoded), LIMITS, counters)
    by_key = {e.event_key: e for e in events}
    out = {}
    for r in plan.records:
        event = by_key[r.event_key]
        payload = event.payload.model_dump(mode="json", exclude={"text"})
        shown = r.view_text if r.view_text is not None else getattr(event.payload, "text", "") or ""
        both = count_record(counters, content_of(event.kind, payload, shown), _rendered_calls(event.payload))
        out[r.event_key] = (both.o200k_base, both.cl100k_base)
    return out


def _no_reads(decoded: Any) -> Any:
    from services.core.ledger import LedgerReads

    return LedgerReads(heads={}, keys={}, calls={})


def test_planning_a_batch_for_the_default_profiles_never_counts_cl100k() -> None:
    events = sample_trace_events("s-lazy-plan")
    spy = _Spy()
    decoded = decode_batch(incoming(events), LIMITS)
    plan = plan_batch(
        decoded, _no_reads(decoded), LIMITS, {"o200k_base": counter_for("o200k_base"), "cl100k_base": spy}
    )
    assert len(plan.records) == len(events)
    assert spy.calls == 0
    assert all(r.tokens.cl100k_counted is None for r in plan.records)
    # Asked for, the deferred count is the one counting both at recording gave.
    eager = _eager(events)
    assert {r.event_key: (r.tokens.o200k_base, r.tokens.cl100k_base) for r in plan.records} == eager
    assert spy.calls > 0


async def test_a_record_read_back_counts_cl100k_on_first_use_as_recording_both_did(store: Store) -> None:
    events = sample_trace_events(f"s-lazy-{id(store)}")
    # As the recorder plans: it holds an o200k counter only.
    counters = {"o200k_base": counter_for("o200k_base")}
    by_thread: dict[str, list[Event]] = {}
    for e in events:
        by_thread.setdefault(e.thread_id, []).append(e)
    async with store.connection() as s:
        decoded = decode_batch(incoming(events), LIMITS)
        plan = plan_batch(decoded, await s.read_for_batch(batch_keys(decoded)), LIMITS, counters)
        async with s.transaction():
            await s.write_plan(plan, recorded_by="lazy", keep_raw=1024)
        read = [r for t in by_thread for r in await s.select_records(t, gt=0, lte=10_000)]
    assert len(read) == len(events)
    assert all(r.tokens.cl100k_counted is None for r in read)
    got = {r.event_key: (r.tokens.get("o200k_base"), r.tokens.get("cl100k_base")) for r in read}
    assert got == _eager(events)
    masked = [r for r in read if r.mask_tokens is not None]
    assert masked, "the samples have outputs long enough to be masked"
    for r in masked:
        assert r.mask_tokens is not None and r.mask_text is not None
        assert r.mask_tokens.cl100k_base == counter_for("cl100k_base").count(
            content_of(r.kind, r.payload, r.mask_text)
        )
