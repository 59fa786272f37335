"""A prepared context's reply bytes written from kept fragments are the reply's own bytes.

Every bundled sample trace, grown record by record under a kept view memo (as the fleet serves a
thread), in each request format and at a comfortable and a tight budget: ``PreparedJson`` gives
``reply_json``'s bytes on every prepare, and a prepare of an unchanged view that fits writes nothing
again.
"""

from __future__ import annotations

import json

import pytest

from contracts import PrepareRequest, PreparedContext
from contracts._base import reply_json
from contracts.prepare import RequestFormat
from infra import SAMPLES_DIR
from services.core.assemble import ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from services.core.prepared_json import PreparedJson
from services.core.records import LedgerRecord
from services.core.tokens import counter_for
from services.core.trace import read_trace
from services.core.view_memo import ViewMemo
from services.errors import ContextBudgetExceeded
from services.edge.replay import ReplayOptions, trace_events
from tests.fixtures.builders import ledger_records

_TRACES = sorted(p.name for p in SAMPLES_DIR.glob("*.jsonl"))


def _prepare(records: list[LedgerRecord], memo: ViewMemo, fmt: RequestFormat, budget: int) -> PreparedContext:
    first = records[0]
    request = PrepareRequest(
        session_id="s", run_id="r", instance_id="main", budget_tokens=budget, format=fmt, context_tools=True
    )
    snapshot = ThreadSnapshot(
        "s",
        "r",
        "main",
        len(records),
        records[-1].seq,
        records[-1].event_key,
        list(records),
        own_thread=first.thread_id,
        memo=memo,
    )
    return assemble_context(
        snapshot, request, resolve_budget(request), counter_for("o200k_base"), allow_drop_history=True
    )


@pytest.mark.parametrize("trace", _TRACES)
@pytest.mark.parametrize("fmt", ["openai.chat", "anthropic.messages", "openai.responses"])
@pytest.mark.parametrize("budget", [200_000, 8_000])
def test_reply_bytes_from_kept_fragments_equal_the_replys_own_bytes_as_a_thread_grows(
    trace: str, fmt: RequestFormat, budget: int
) -> None:
    records = ledger_records(trace_events(read_trace(SAMPLES_DIR / trace), ReplayOptions(session_id="s")))
    memo, write = ViewMemo(records[0].thread_id), PreparedJson()
    step = max(1, len(records) // 12)
    served: list[int] = []
    for k in [*range(2, len(records), step), len(records)]:
        try:
            prepared = _prepare(records[:k], memo, fmt, budget)
        except ContextBudgetExceeded:
            continue  # required content alone over a tight budget: an error reply, written whole
        assert write(prepared) == reply_json(prepared)
        served.append(k)
    assert served
    misses = write.misses
    again = _prepare(records[: served[-1]], memo, fmt, budget)
    assert write(again) == reply_json(again)
    if not again.reductions:
        # An unchanged view: every message and block written before. (A reduction — a masked group,
        # the note standing for dropped history — is made again by every prepare that needs it.) The
        # reply itself is another object (a prepare that may drop history is never taken from the view's
        # memo), so it is the one thing written again.
        assert write.misses == misses + 1


def test_fragments_are_found_only_for_the_very_objects_they_were_written_from() -> None:
    raw = reply_json(_prepare(_sample(), ViewMemo("x"), "openai.chat", 200_000))
    write = PreparedJson()
    first = PreparedContext.model_validate_json(raw)
    assert write(first) == raw and write.hits == 0
    # Equal objects parsed again are other objects: written again, never taken for the first ones.
    again = PreparedContext.model_validate_json(raw)
    assert write(again) == raw and write.hits == 0
    # The very object written before: its whole reply is taken as it was.
    misses = write.misses
    assert write(first) == raw and (write.hits, write.misses) == (1, misses)


def test_fragments_stay_within_their_byte_bound_and_the_bytes_stay_right() -> None:
    records = _sample()
    memo, write = ViewMemo(records[0].thread_id), PreparedJson(max_bytes=20_000)
    for k in range(2, len(records) + 1):
        prepared = _prepare(records[:k], memo, "openai.chat", 200_000)
        assert json.loads(write(prepared)) == json.loads(reply_json(prepared))
        assert write(prepared) == reply_json(prepared)
        # Each generation turns once past half the bound: each holds at most half and one entry more.
        largest = max(len(reply_json(m)) for m in (*prepared.messages, *prepared.blocks, prepared))
        assert write.held_bytes <= 20_000 + 2 * (200 + 2 * largest)


def _sample() -> list[LedgerRecord]:
    return ledger_records(trace_events(read_trace(SAMPLES_DIR / _TRACES[0]), ReplayOptions(session_id="s")))
