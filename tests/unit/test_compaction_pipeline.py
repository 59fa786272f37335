"""Selection, the structured summarizer, validation, chaining and segment halving — no I/O."""

from __future__ import annotations

import pytest

from contracts import CompactionPolicy
from services.app.compacting import _summarize
from services.core.compaction.merge import merge_summaries, render_summary
from services.core.compaction.model import (
    Segment,
    SegmentTooLong,
    SourcedText,
    StructuredSummary,
    SummarizerFailed,
)
from services.core.compaction.select import choose_cover, eligible_blocks, split_segments
from services.core.tokens import counter_for
from tests.unit.test_compaction_select import measured
from services.core.compaction.structured import StructuredSummarizer, summarize_records
from services.core.compaction.validate import CandidateInvalid, validate_candidate
from services.core.groups import build_view_blocks
from tests.fixtures.builders import Thread, ledger_records

pytestmark = pytest.mark.anyio


def _coding_history(t: Thread) -> list:  # type: ignore[type-arg]
    return [
        t.system("You fix bugs."),
        t.user("Fix tests/test_parser.py. You must not change the public API. Run pytest after editing."),
        t.assistant("I will read the parser first.", calls=(("c1", "bash", {"cmd": "cat src/parser.py"}),)),
        t.outcome("c1", "def parse(s):\n    return s.split()\n"),
        t.assistant(
            "Let me patch it.",
            calls=(("c2", "bash", {"cmd": "sed -i 's/split()/split(\" \")/' src/parser.py"}),),
        ),
        t.outcome("c2", ""),
        t.assistant(calls=(("c3", "bash", {"cmd": "pytest -x tests/test_parser.py"}),)),
        t.outcome(
            "c3",
            "E   AssertionError: expected 'a + b', got 'a+b'\nFAILED tests/test_parser.py::test_render E1101",
            status="error",
        ),
        t.assistant(
            "The renderer drops spaces; next I will edit render().",
            calls=(
                (
                    "c4",
                    "str_replace_editor",
                    {"command": "create", "path": "src/render.py", "file_text": "x"},
                ),
            ),
        ),
        t.outcome("c4", "File created successfully"),
    ]


def test_structured_summary_keeps_files_failures_constraints_and_identifiers_verbatim() -> None:
    records = ledger_records(_coding_history(Thread()))[1:]
    s = summarize_records(records)
    assert s.goal is not None and s.goal.sources == (2,)
    assert any("must not change the public API" in c.text for c in s.constraints)
    assert [f.path for f in s.files_modified] == ["src/parser.py", "src/render.py"]
    assert "src/parser.py" in [f.path for f in s.files_read]
    (failure,) = s.failures
    assert (failure.call_id, failure.status, failure.sources) == ("c3", "error", (7, 8))
    assert "E1101" in failure.detail and "tests/test_parser.py::test_render" in failure.detail
    assert s.next_steps and s.covered_from == 2 and s.covered_to == 10


def test_structured_summary_is_deterministic() -> None:
    records = ledger_records(_coding_history(Thread(session_id="s", run_id="r")))
    assert summarize_records(records) == summarize_records(list(records))


def test_validate_refuses_a_summary_missing_a_modified_file_or_a_failure_or_citing_outside() -> None:
    records = ledger_records(_coding_history(Thread()))[1:]
    good = summarize_records(records)
    seqs = {r.seq for r in records}
    validate_candidate(good, parent=None, covered=records, existing_seqs=seqs, has_request=True)
    cases = {
        "modified files missing": good.model_copy(update={"files_modified": good.files_modified[:1]}),
        "tool failures missing": good.model_copy(update={"failures": ()}),
        "outside the covered range": good.model_copy(
            update={"decisions": (SourcedText(text="x", sources=(99,)),)}
        ),
        "no next steps": good.model_copy(update={"next_steps": ()}),
        "no goal or current request": good.model_copy(update={"goal": None, "current_request": None}),
    }
    for expected, candidate in cases.items():
        with pytest.raises(CandidateInvalid, match=expected):
            validate_candidate(candidate, parent=None, covered=records, existing_seqs=seqs, has_request=True)


def test_cover_keeps_recent_groups_and_stops_before_an_open_group() -> None:
    t = Thread()
    events = [t.user("go")]
    for n in range(5):
        events += [t.assistant(calls=((f"c{n}", "ls", {}),)), t.outcome(f"c{n}", "x " * 200)]
    events += [t.assistant(calls=(("open", "ls", {}),))]  # no outcome yet
    events += [t.assistant(calls=(("c9", "ls", {}),)), t.outcome("c9", "late")]
    blocks = build_view_blocks(ledger_records(events))
    eligible = eligible_blocks(blocks, keep_recent=2)
    assert [b.block_id for b in eligible] == ["group:2", "group:4", "group:6", "group:8"]
    assert [b.block_id for b in eligible_blocks(blocks, keep_recent=0)][
        -1
    ] == "group:10"  # never past "group:12"


def test_cover_stops_once_the_target_is_reachable_and_takes_everything_for_turn_triggers() -> None:
    t = Thread()
    events = [t.user("go")]
    for n in range(8):
        events += [t.assistant(calls=((f"c{n}", "ls", {}),)), t.outcome(f"c{n}", "word " * 400)]
    records = ledger_records(events)
    blocks = build_view_blocks(records)
    policy = CompactionPolicy(keep_recent_groups=1)
    measure, eligible, sizes = measured(blocks, policy, 4_000)
    by_ratio = choose_cover(eligible, measure, policy, sizes, ratio_hit=True)
    by_turns = choose_cover(eligible, measure, policy, sizes, ratio_hit=False)
    assert by_ratio is not None and by_turns is not None
    assert len(by_turns.blocks) == len(eligible) == 7
    assert 0 < len(by_ratio.blocks) < 7
    assert measure.estimated - by_ratio.tokens <= 2_400 - 200  # target 60% minus room for the summary


def test_chained_summary_covers_the_parent_range_and_never_drops_constraints() -> None:
    t = Thread()
    records = ledger_records(_coding_history(t))[1:]
    first = summarize_records(records[:4])
    second = summarize_records(records[4:])
    merged = merge_summaries(first, second)
    assert (merged.covered_from, merged.covered_to) == (2, 10)
    assert merged.constraints == first.constraints + second.constraints
    assert [c.text for c in merged.constraints] == ["You must not change the public API."]
    # The newer part has no request of its own: the chained summary keeps the older one's.
    assert second.current_request is None and merged.current_request == first.current_request
    assert merged.current_request is not None and merged.current_request.sources == (2,)
    assert "Current request: record 2" in render_summary(merged, revision=2)
    assert render_summary(merged, revision=2).startswith("[context summary r2: records 2–10")


class _Scripted:
    """A summarizer that rejects segments longer than ``max_blocks`` records, like a provider would."""

    name = "scripted"

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self.seen: list[tuple[int, int]] = []

    async def summarize(self, segment: Segment) -> StructuredSummary:
        self.seen.append((segment.first_seq, segment.last_seq))
        if len(segment.records) > self.max_records:
            raise SegmentTooLong("context_length_exceeded")
        return summarize_records(segment.records)


async def test_a_segment_the_provider_rejects_is_halved_and_retried_never_skipped() -> None:
    t = Thread()
    events = [t.user("go")]
    for n in range(4):
        events += [t.assistant(calls=((f"c{n}", "ls", {}),)), t.outcome(f"c{n}", "x")]
    blocks = build_view_blocks(ledger_records(events)).ready[1:]
    summarizer = _Scripted(max_records=2)
    merged, calls = await _summarize(summarizer, [blocks], None, max_calls=10)
    assert summarizer.seen == [(2, 9), (2, 5), (2, 3), (4, 5), (6, 9), (6, 7), (8, 9)]
    assert calls == 7 and (merged.covered_from, merged.covered_to) == (2, 9)
    assert [p.sources for p in merged.progress] == [(2, 3), (4, 5), (6, 7), (8, 9)]


async def test_a_job_in_several_segments_lists_every_failure_of_its_range_and_validates() -> None:
    # More failures than a summary keeps from its parent, spread over two segments of one job: the
    # first segment's failures are the job's own, so none may fall off when the second is merged.
    t = Thread()
    events = [t.user("Make the build pass.")]
    for n in range(40):
        events += [
            t.assistant(calls=((f"c{n}", "bash", {"cmd": f"make target{n}"}),)),
            t.outcome(f"c{n}", f"make: *** [target{n}] Error 2", status="error"),
        ]
    records = ledger_records(events)
    blocks = build_view_blocks(records).ready[1:]
    segments = [blocks[:30], blocks[30:]]

    merged, calls = await _summarize(StructuredSummarizer(), segments, None, max_calls=10)

    covered = sorted((r for b in blocks for r in b.records), key=lambda r: r.seq)
    assert calls == 2 and len(merged.failures) == 40
    validate_candidate(
        merged, parent=None, covered=covered, existing_seqs={r.seq for r in records}, has_request=False
    )
    # Across jobs the cap still holds: a later job's summary keeps the newest of its parent's.
    later = merge_summaries(merged, summarize_records(records[-2:]))
    assert len(later.failures) <= 25


async def test_halving_stops_at_one_group_and_at_the_call_limit() -> None:
    t = Thread()
    events = [t.user("go"), t.assistant(calls=(("c", "ls", {}),)), t.outcome("c", "x")]
    (group,) = build_view_blocks(ledger_records(events)).ready[1:]
    with pytest.raises(SummarizerFailed, match="too long"):
        await _summarize(_Scripted(max_records=1), [[group]], None, max_calls=10)
    blocks = [group] * 8
    with pytest.raises(SummarizerFailed, match="more than 2"):
        await _summarize(_Scripted(max_records=2), [blocks], None, max_calls=2)


def test_split_segments_packs_whole_blocks_in_order() -> None:
    t = Thread()
    events = [t.user("go")]
    for n in range(6):
        events += [t.assistant(calls=((f"c{n}", "ls", {}),)), t.outcome(f"c{n}", "word " * 100)]
    blocks = build_view_blocks(ledger_records(events)).ready[1:]
    segments = split_segments(blocks, 250, counter_for("o200k_base"))
    assert [b.block_id for seg in segments for b in seg] == [b.block_id for b in blocks]
    assert all(len(seg) >= 1 for seg in segments) and len(segments) >= 3


async def test_structured_summarizer_sets_the_current_request_from_its_own_record() -> None:
    t = Thread()
    records = ledger_records(_coding_history(t))
    task = records[1]
    s = await StructuredSummarizer(task).summarize(Segment(records=records[2:6], parent=None, instruction=""))
    assert s.current_request is not None and s.current_request.sources == (task.seq,)
    # Taken from the request's own record although the segment never contains it.
    assert task not in records[2:6] and s.current_request.text == task.text
