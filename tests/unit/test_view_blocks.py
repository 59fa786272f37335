"""A view's blocks built from the previous build's are the blocks a whole build gives.

``build_view_blocks(records, ..., previous=...)`` keeps the blocks an append cannot move and builds
the rest; these tests hold it to a build without ``previous`` on every bundled sample grown one record
at a time, and show what it keeps and when it builds everything again. An assembly given the previous
one takes its wire blocks where they are equal (``tests/unit/test_view_cache.py`` holds whole contexts
through the view cache to assembly without it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from contracts import PreparedContext, PrepareRequest, Retention

from infra import SAMPLES_DIR
from services.core.assemble import ThreadSnapshot, assemble_view
from services.core.budget import resolve_budget
from services.core.groups import BlockSet, build_view_blocks
from services.core.tokens import counter_for
from services.core.trace import read_trace
from services.edge.replay import ReplayOptions, trace_events
from tests.fixtures.builders import Thread, ledger_records


@pytest.mark.parametrize("trace", sorted(p.name for p in SAMPLES_DIR.glob("*.jsonl")))
@pytest.mark.parametrize("covered", [0, 9])
def test_blocks_extended_record_by_record_equal_blocks_built_whole(trace: str, covered: int) -> None:
    records = ledger_records(trace_events(read_trace(SAMPLES_DIR / trace), ReplayOptions(session_id="s")))
    own = records[0].thread_id
    previous: BlockSet | None = None
    kept = 0
    for k in range(1, len(records) + 1):
        view = records[:k]
        built = build_view_blocks(view, covered, own_thread=own, previous=previous)
        assert built == build_view_blocks(view, covered, own_thread=own)
        if previous is not None and previous.ready and built.ready[0] is previous.ready[0]:
            kept += 1
        previous = built
    assert kept > len(records) // 2  # most steps extended the build before rather than starting over


def _grown_thread(groups: int) -> tuple[Thread, list[Any]]:
    t = Thread()
    events = [t.system("You fix bugs."), t.user("Fix the failing test.")]
    for n in range(groups):
        events.append(t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat f{n}.py"}),)))
        events.append(t.outcome(f"c{n}", f"line {n}\n" * 5))
    return t, events


def test_an_appended_record_builds_only_its_own_block_and_keeps_the_others() -> None:
    t, events = _grown_thread(6)
    records = ledger_records([*events, t.assistant(calls=(("late", "bash", {"cmd": "ls"}),))])
    before = build_view_blocks(records[:-1], own_thread=t.thread_id)
    after = build_view_blocks(records, own_thread=t.thread_id, previous=before)
    assert all(a is b for a, b in zip(before.ready, after.ready, strict=False))
    assert [p.call_id for p in after.pending] == ["late"]
    # Its outcome closes the held group: the group is built again, with both records.
    late = t.assistant(calls=(("late", "bash", {"cmd": "ls"}),))
    closed = ledger_records([*events, late, t.outcome("late", "x")])
    done = build_view_blocks(closed, own_thread=t.thread_id, previous=after)
    assert done == build_view_blocks(closed, own_thread=t.thread_id)
    assert done.pending == () and len(done.ready[-1].records) == 2


def test_a_new_request_moves_the_current_turn_and_equals_a_whole_build() -> None:
    t, events = _grown_thread(4)
    records = ledger_records([*events, t.user("and now the docs"), t.assistant("On it.")])
    before = build_view_blocks(records[:-2], own_thread=t.thread_id)
    after = build_view_blocks(records, own_thread=t.thread_id, previous=before)
    assert after == build_view_blocks(records, own_thread=t.thread_id)
    # The groups were the current turn; the new request makes them an earlier one.
    groups = [b.block_id for b in before.ready if b.block_id.startswith("group:")]
    retention = {b.block_id: b.retention for b in after.ready}
    assert {b.retention for b in before.ready if b.block_id in groups} == {Retention.ACTIVE}
    assert {retention[g] for g in groups} == {Retention.COMPRESSIBLE}


def test_equal_records_that_are_other_objects_reuse_the_build_and_give_the_same_blocks() -> None:
    t, events = _grown_thread(3)
    records = ledger_records(events)
    before = build_view_blocks(records, own_thread=t.thread_id)
    # A reload after eviction: equal records, other objects.
    reread = [replace(r) for r in records]
    assert all(a is not b for a, b in zip(records, reread, strict=True))
    assert build_view_blocks(reread, own_thread=t.thread_id, previous=before) is before
    assert build_view_blocks(reread, own_thread=t.thread_id) == before


@pytest.mark.parametrize("change", ["coverage", "thread", "not_a_prefix"])
def test_a_previous_build_of_other_records_or_coverage_is_not_extended(change: str) -> None:
    t, events = _grown_thread(5)
    records = ledger_records(events)
    before = build_view_blocks(records[:-2], own_thread=t.thread_id)
    covered, own, view = 0, t.thread_id, records
    if change == "coverage":
        covered = records[6].seq
    elif change == "thread":
        own = "another"
    else:
        view = [records[0], *records[2:]]
    built = build_view_blocks(view, covered, own_thread=own, previous=before)
    assert built == build_view_blocks(view, covered, own_thread=own)
    assert not any(a is b for a, b in zip(before.ready[1:], built.ready[1:], strict=False))


def test_an_assembly_after_an_append_takes_the_earlier_wire_blocks_that_did_not_change() -> None:
    t, events = _grown_thread(6)
    records = ledger_records([*events, t.assistant("All six files read.")])
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=9_000
    )
    budget, counter = resolve_budget(request), counter_for("o200k_base")

    def snapshot(k: int) -> ThreadSnapshot:
        view = records[:k]
        return ThreadSnapshot(
            t.session_id,
            t.run_id,
            t.instance_id,
            k,
            view[-1].seq,
            view[-1].event_key,
            view,
            own_thread=t.thread_id,
        )

    before = assemble_view(snapshot(len(records) - 1), request, budget, counter)
    after = assemble_view(snapshot(len(records)), request, budget, counter, previous=before)
    assert isinstance(before.context, PreparedContext) and isinstance(after.context, PreparedContext)
    assert after.context == assemble_view(snapshot(len(records)), request, budget, counter).context
    # Every block of the earlier context is where it was: taken as it was; the new answer is new.
    assert all(a is b for a, b in zip(before.context.blocks, after.context.blocks, strict=False))
    assert [b.block_id for b in after.context.blocks[len(before.context.blocks) :]] == [
        f"turn:{records[-1].seq}"
    ]
