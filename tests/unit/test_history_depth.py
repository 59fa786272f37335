"""Which depth of a thread's history a prepare starts from: records in full while they may fit."""

from __future__ import annotations

from dataclasses import replace

from services.app.view_cache import ViewCache, first_depth_reusing
from services.core.assemble import SummaryView, ThreadSnapshot
from services.core.budget import BudgetSpec
from services.core.history_depth import depths_of, first_depth, smallest_history
from services.core.records import LedgerRecord
from tests.fixtures.builders import Thread, ledger_records


def _records() -> list[LedgerRecord]:
    t = Thread()
    events = [t.system("Be brief."), t.user("question 0: " + "why " * 50)]
    for i in range(6):
        events.append(t.assistant(f"answer {i}: " + "the tokenizer joins tokens " * 40))
        events.append(t.user(f"question {i + 1}"))
    return ledger_records(events)


def _summary(covered_to: int, tokens: int = 5) -> SummaryView:
    return SummaryView(f"s{covered_to}", 1, 3, covered_to, "[context summary]", tokens, tokens, ())


def _snapshot(records: list[LedgerRecord], *, covered_to: int = 0) -> ThreadSnapshot:
    t = Thread()
    summary = None
    if covered_to:
        summary = _summary(covered_to)
    return ThreadSnapshot(
        t.session_id,
        t.run_id,
        t.instance_id,
        len(records),
        records[-1].seq,
        records[-1].event_key,
        records,
        view_revision=1 if covered_to else 0,
        covered_to=covered_to,
        summary=summary,
    )


def test_a_view_without_a_summary_has_one_depth() -> None:
    snapshot = _snapshot(_records())
    assert depths_of(snapshot) == (snapshot,)
    assert first_depth(depths_of(snapshot), 10_000, "o200k_base", made_for=4_000) == 0


def test_a_summarized_view_shows_its_records_in_full_first_and_its_summary_one_deeper() -> None:
    records = _records()
    snapshot = _snapshot(records, covered_to=10)
    full, summarized = depths_of(snapshot)
    assert summarized == snapshot
    assert (full.summary, full.covered_to, full.records) == (None, 0, snapshot.records)
    assert full.view_revision == snapshot.view_revision  # the same view, shown less compressed


def test_a_budget_larger_than_the_summarys_starts_from_the_records_while_they_may_fit() -> None:
    records = _records()
    depths = depths_of(_snapshot(records, covered_to=10))
    whole = smallest_history(records, "o200k_base")
    assert first_depth(depths, whole, "o200k_base", made_for=whole - 100) == 0
    assert first_depth(depths, whole - 1, "o200k_base", made_for=whole - 100) == 1


def test_a_budget_no_larger_than_the_one_the_summary_was_made_for_starts_from_the_summary() -> None:
    records = _records()
    depths = depths_of(_snapshot(records, covered_to=10))
    whole = smallest_history(records, "o200k_base")
    # The thread compacts ahead of this budget: its records would only be compacted again.
    assert first_depth(depths, whole, "o200k_base", made_for=whole) == 1
    assert first_depth(depths, 10 * whole, "o200k_base", made_for=10 * whole) == 1


def test_the_smallest_history_counts_each_output_at_its_preview() -> None:
    t = Thread()
    records = ledger_records(
        [
            t.system("s"),
            t.user("q"),
            t.assistant("a", calls=(("c1", "bash", {"cmd": "cat big.log"}),)),
            t.outcome("c1", "line of a long log\n" * 2_000),
        ]
    )
    output = records[-1]
    assert output.mask_tokens is not None and output.mask_tokens.o200k_base < output.tokens.o200k_base
    rest = sum(r.tokens.o200k_base for r in records[:-1])
    assert smallest_history(records, "o200k_base") == rest + output.mask_tokens.o200k_base
    assert smallest_history(records, "cl100k_base") == sum(
        (r.mask_tokens or r.tokens).cl100k_base for r in records
    )


def test_the_summaries_a_committed_one_extends_are_depths_between_the_records_and_it() -> None:
    records = _records()
    snapshot = _snapshot(records, covered_to=10)
    earlier = (_summary(4), _summary(7))
    full, first, second, committed = depths_of(snapshot, earlier)
    assert full.summary is None and committed == snapshot
    assert (first.summary, first.covered_to, second.summary, second.covered_to) == (
        earlier[0],
        4,
        earlier[1],
        7,
    )
    # Each deeper depth shows fewer of the records beside its summary.
    sizes = [smallest_history(d.records, "o200k_base", d.summary) for d in (full, first, second, committed)]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 4
    # A budget between two depths starts at the shallower of those that fit.
    assert first_depth((full, first, second, committed), sizes[1], "o200k_base", made_for=100) == 1
    assert first_depth((full, first, second, committed), sizes[2], "o200k_base", made_for=100) == 2


def test_a_depth_counts_the_records_its_summary_does_not_cover_and_the_summary() -> None:
    records = _records()
    summary = _summary(7, tokens=40)
    shown = [r for r in records if not 3 <= r.seq <= 7]
    assert smallest_history(records, "o200k_base", summary) == 40 + smallest_history(shown, "o200k_base")


def _budget(tokens: int) -> BudgetSpec:
    return BudgetSpec(
        profile=f"budget:{tokens}",
        context_window=None,
        input_limit=tokens,
        output_reserve=0,
        safety_margin=0,
        input_budget=tokens,
        encoding="o200k_base",
    )


def test_the_first_depth_is_kept_for_a_head_and_view_and_found_again_after_either_moves() -> None:
    records = _records()
    snapshot = _snapshot(records, covered_to=10)
    depths = depths_of(snapshot)
    cache = ViewCache()
    fits = smallest_history(records, "o200k_base")
    for tokens in (fits, fits - 1):
        expected = first_depth(depths, tokens, "o200k_base", made_for=100)
        assert first_depth_reusing(cache, snapshot, depths, _budget(tokens), 100) == expected
        assert first_depth_reusing(cache, snapshot, depths, _budget(tokens), 100) == expected
    # A snapshot of another head names other records: its depth is counted again, not reused.
    shorter = replace(
        _snapshot(records[:3], covered_to=2), run_id=snapshot.run_id, instance_id=snapshot.instance_id
    )
    assert shorter.own_thread == snapshot.own_thread and shorter.revision != snapshot.revision
    short_depths = depths_of(shorter)
    assert first_depth_reusing(cache, shorter, short_depths, _budget(fits - 1), 100) == first_depth(
        short_depths, fits - 1, "o200k_base", made_for=100
    )
