"""Rung G's retrieval: the step's identifiers as queries, and which hits are archived history to show."""

from __future__ import annotations

from contracts import EventKind

from datetime import datetime, timezone

from contracts import SearchHit
from services.core.assemble import ThreadSnapshot
from services.core.evaluation.retrieval import archived_hits, step_queries
from services.core.records import LedgerRecord, TokenCounts

_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _rec(seq: int, kind: EventKind, text: str, *, args: dict[str, object] | None = None) -> LedgerRecord:
    payload: dict[str, object] = {"call_id": f"c{seq}"} if kind is EventKind.TOOL_OUTCOME else {}
    if kind is EventKind.ASSISTANT_MESSAGE:
        payload = {"tool_calls": [{"call_id": f"c{seq}", "name": "t", "args": args or {}}]}
    return LedgerRecord(
        seq=seq,
        event_key=f"k{seq}",
        kind=kind,
        payload=payload,  # type: ignore[arg-type]
        text=text,
        tokens=TokenCounts(1, 1),
        thread_id="r.a",
    )


def _hit(seq: int, rank: float, *, superseded: bool = False, line: int = 1) -> SearchHit:
    return SearchHit(
        thread_id="r.a",
        seq=seq,
        kind="tool_outcome",
        event_key=f"k{seq}",
        recorded_at=_AT,
        snippet="",
        start_byte=0,
        end_byte=1,
        start_line=line,
        end_line=line,
        rank=rank,
        superseded=superseded,
    )


def test_step_queries_take_identifiers_of_the_newest_records_then_of_the_last_call() -> None:
    records = [
        _rec(1, EventKind.USER_INPUT, "fix src/old_module.py please"),
        _rec(2, EventKind.ASSISTANT_MESSAGE, "", args={"cmd": "pytest tests/test_io.py"}),
        _rec(3, EventKind.TOOL_OUTCOME, "FAILED tests/test_io.py::test_read - E1234 error in io_utils"),
    ]

    # The outcome is the step: its identifiers first (then the call's, here the same file); words
    # without a digit, an underscore, a dot or a slash ("FAILED", "error") are no identifiers, and
    # nothing from before the call is the step.
    assert step_queries(records) == ("tests/test_io.py", "test_read", "E1234")
    assert step_queries(records, limit=4) == ("tests/test_io.py", "test_read", "E1234", "io_utils")
    assert step_queries([_rec(1, EventKind.USER_INPUT, "just words here")]) == ()


def test_archived_hits_keep_covered_not_superseded_records_once_each_best_first() -> None:
    records = [_rec(s, EventKind.TOOL_OUTCOME, "x") for s in range(1, 7)]
    snapshot = ThreadSnapshot("s", "r", "a", 6, 6, "k6", records, covered_to=4)
    hits = [
        _hit(5, 9.0),  # still in the view's history: not archive
        _hit(2, 1.0, superseded=True),  # its fact was replaced: never brought back
        _hit(3, 0.5),
        _hit(3, 0.4, line=40),  # a second chunk of the same record
        _hit(1, 0.7),
        _hit(4, 0.1),
    ]

    assert [h.seq for h in archived_hits(hits, snapshot)] == [1, 3, 4]
    assert [h.seq for h in archived_hits(hits, snapshot, limit=1)] == [1]
