"""The typed read-side record: kinds mirror the wire union, bodies read what the recorder stored."""

from __future__ import annotations

from contracts import (
    AssistantMessagePayload,
    ContextExportPayload,
    EventKind,
    ToolCall,
    UserInputPayload,
)

from typing import get_args

from contracts import EVENT_KINDS, Event, ToolCall, UserInputEvent, UserInputPayload
from services.core.turns import turns_and_steps
from services.core.ledger import LedgerReads, RecordingLimits, decode_batch, plan_batch
from services.core.records import (
    LedgerRecord,
    TokenCounts,
    parse_body,
)
from services.core.render import content_of, omitted_marker, record_content, trim_tool_text
from services.core.tokens import ENCODINGS, counter_for
from services.app.views import count_totals
from tests.fixtures.builders import Thread, incoming, ledger_records


def test_record_kinds_are_exactly_the_wire_kinds() -> None:
    union = get_args(get_args(Event)[0])
    assert [m.model_fields["kind"].default for m in union] == list(EVENT_KINDS)
    assert [k.value for k in EventKind] == list(EVENT_KINDS)


def test_every_recorded_kind_reads_back_as_its_typed_body() -> None:
    t = Thread()
    events = [
        t.system("be careful"),
        t.user("fix the bug"),
        t.assistant("looking", calls=(("c1", "bash", {"cmd": "ls"}),)),
        t.outcome("c1", "boom", status="error"),
        t.resource("skill-1", "how to"),
        t.child("done it"),
        t.reset("user asked"),
        t.run_status("failed", reason="crashed"),
    ]
    records = ledger_records(events)
    assert [EventKind(e.kind) for e in events] == [r.kind for r in records]
    # An export is published into a child's thread, which needs its parent recorded: built as stored.
    export = t.child_thread().export([("r-x.main", 2)], note="background")
    stored = LedgerRecord(
        1,
        "k",
        EventKind(export.kind),
        export.payload.model_dump(mode="json", exclude={"text"}),
        "background",
        TokenCounts(1, 1),
    )
    assert stored.body == export.payload
    assert [r.body for r in records] == [e.payload for e in events]


def test_the_typed_renderer_is_the_one_the_recorder_counted_with() -> None:
    t = Thread()
    for r in ledger_records(
        [
            t.user("q"),
            t.assistant(calls=(("c1", "bash", {}),)),
            t.outcome("c1", "x" * 50, "timeout"),
            t.resource("d", "doc"),
            t.child("ok"),
        ]
    ):
        assert record_content(r.body, r.text) == content_of(r.kind, r.payload, r.text)
    outcome = ledger_records([t.assistant(calls=(("c2", "bash", {}),)), t.outcome("c2", "out", "timeout")])[1]
    assert record_content(outcome.body, outcome.text) == "[tool status: timeout]\nout"


def test_the_view_counts_turns_and_steps_as_the_recorder_does() -> None:
    t = Thread()
    supplement = UserInputEvent(
        payload=UserInputPayload(text="also this", intent="supplement"), **t._env(None)
    )
    events = [t.user("a"), t.assistant("b"), supplement, t.assistant("c"), t.user("d")]
    lim = RecordingLimits()
    plan = plan_batch(
        decode_batch(incoming(events), lim),
        LedgerReads({}, {}, {}),
        lim,
        {n: counter_for(n) for n in ENCODINGS},
    )
    (head,) = plan.heads
    records = ledger_records(events)
    assert turns_and_steps(records) == (head.user_turns, head.model_steps) == (2, 2)
    assert (count_totals(records).user_turns, count_totals(records).model_steps) == (2, 2)


def test_a_replaced_record_reads_its_new_payload() -> None:
    from dataclasses import replace

    export = Thread().child_thread().export([("r-x.main", 2)])
    record = LedgerRecord(
        1,
        "k",
        EventKind(export.kind),
        export.payload.model_dump(mode="json", exclude={"text"}),
        "",
        TokenCounts(1, 1),
    )
    noted = replace(record, payload={**record.payload, "note": "read these first"})
    assert isinstance(noted.body, ContextExportPayload) and noted.body.note == "read these first"
    assert isinstance(record.body, ContextExportPayload) and record.body.note == ""


def test_both_cuts_share_one_omitted_marker() -> None:
    counter = counter_for("o200k_base")
    text = "\n".join(f"line {i}" for i in range(400))
    ref = "ctx://blob/" + "0" * 64
    cut = trim_tool_text(text, counter, max_tokens=50, blob_ref=ref)
    assert cut is not None
    full = counter.count(text)
    where = f"(full output: {len(text)} chars, 400 lines; read it back from {ref})"
    assert omitted_marker(full - 50, full, where) in cut[0]
    assert (
        omitted_marker(7, 9, "to fit the context; x")
        == "\n[… 7 of 9 tokens omitted to fit the context; x …]\n"
    )


def test_a_call_is_stored_back_as_the_recorder_stores_it() -> None:
    call = ToolCall(
        call_id="c1", name="bash", args={"command": "ls", "n": [1, {"a": None}]}, operation_id="op-1"
    )
    record = ledger_records([Thread().assistant(calls=(("c1", "bash", {"command": "ls"}),))])[0]
    assert isinstance(record.body, AssistantMessagePayload)
    (body,) = record.body.tool_calls
    assert body.model_dump(mode="json") == ToolCall(
        call_id="c1", name="bash", args={"command": "ls"}
    ).model_dump(mode="json")
    stored = {"tool_calls": [call.model_dump(mode="json")]}
    parsed = parse_body(EventKind.ASSISTANT_MESSAGE, stored)
    assert isinstance(parsed, AssistantMessagePayload)
    assert [c.model_dump(mode="json") for c in parsed.tool_calls] == stored["tool_calls"]
