"""A summary replaces exactly the records of its range; what precedes the range stays in view. Pure."""

from __future__ import annotations

import dataclasses

from services.core.compaction.merge import merge_summaries
from services.core.compaction.structured import summarize_records
from services.core.compaction.validate import validate_candidate
from services.core.groups import build_view_blocks
from services.core.records import LedgerRecord
from tests.fixtures.builders import Thread, ledger_records


def _forked_thread() -> list[LedgerRecord]:
    """A fork's view: the parent's instructions, question and first tool group (seqs 1–4), then the
    fork's own three tool groups (5–10) and its own new question (11)."""
    t = Thread()
    events = [t.system("You are the support agent."), t.user("Where is order 42?")]
    events += [t.assistant("a1", calls=(("c1", "lookup", {"order": 42}),)), t.outcome("c1", "shipped")]
    for i, (call, result) in enumerate((("refund", "queued"), ("notify", "sent"), ("close", "closed"))):
        events += [t.assistant(f"f{i}", calls=((f"d{i}", call, {"order": 42}),)), t.outcome(f"d{i}", result)]
    events.append(t.user("Then refund it."))
    return [
        dataclasses.replace(r, thread_id="parent" if r.seq <= 4 else "fork") for r in ledger_records(events)
    ]


def _shown_seqs(records: list[LedgerRecord], covered_from: int, covered_to: int) -> set[int]:
    blocks = build_view_blocks(records, covered_to, covered_from=covered_from, own_thread="fork")
    return {r.seq for b in blocks.ready for r in b.records}


def test_a_request_left_out_of_a_summary_is_shown_once_a_newer_request_takes_its_place() -> None:
    records = _forked_thread()
    # Summarized while the parent's question was the current request: the summary covers 3–8 and
    # points at record 2 as "shown in full outside this summary".
    shown = _shown_seqs(records, covered_from=3, covered_to=8)
    assert 2 in shown
    assert not shown & set(range(3, 9))
    assert {1, 9, 10, 11} <= shown


def test_a_summary_from_the_first_record_covers_every_interaction_up_to_its_end() -> None:
    records = _forked_thread()
    assert _shown_seqs(records, covered_from=2, covered_to=8) == {1, 9, 10, 11}


def test_a_later_compaction_that_covers_the_left_out_request_widens_the_range_down() -> None:
    records = _forked_thread()
    by_seq = {r.seq: r for r in records}
    parent = summarize_records([by_seq[s] for s in range(3, 9)], current_request=by_seq[2])
    child = summarize_records([by_seq[s] for s in (2, 9, 10)], current_request=by_seq[11])
    merged = merge_summaries(parent, child)
    assert (merged.covered_from, merged.covered_to) == (2, 10)
    covered = [by_seq[s] for s in (2, 9, 10)]
    validate_candidate(merged, parent=parent, covered=covered, existing_seqs=by_seq, has_request=True)
