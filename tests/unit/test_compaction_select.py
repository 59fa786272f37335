"""How much a summary may take and how far a compaction covers at tight budgets. Pure."""

from __future__ import annotations

from dataclasses import replace

from contracts import BlockKind, CompactionPolicy
from services.core.compaction.policy import ViewMeasure
from services.core.assemble import view_sizes
from services.core.compaction.select import choose_cover, eligible_blocks, measure_view, summary_cap
from services.core.groups import BlockSet, DraftBlock, build_view_blocks
from services.core.render import MESSAGE_OVERHEAD
from services.core.tokens import counter_for
from tests.fixtures.builders import Thread, ledger_records


def test_summary_cap_is_the_policy_share_at_comfortable_budgets() -> None:
    assert summary_cap(CompactionPolicy(), 100_000, 5_000) == 25_000
    assert summary_cap(CompactionPolicy(summary_ratio=0.1), 100_000, 5_000) == 10_000


def test_summary_cap_leaves_half_the_free_room_to_recent_history_under_a_large_system_prompt() -> None:
    # 8k budget, 5k required (a 4.7k system prompt + the task): 3k free, the summary gets 1.5k, not 2k.
    assert summary_cap(CompactionPolicy(), 8_000, 5_000) == 1_500
    assert summary_cap(CompactionPolicy(), 8_000, 9_000) == 0


def _events(t: Thread, groups: int, words: int = 50) -> list:  # type: ignore[type-arg]
    events = [t.system("rules"), t.user("fix it", key="task")]
    for i in range(groups):
        events.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat f{i}.py"}),)))
        # Each output its own: a repeated one would be counted as the reference that stands for it.
        events.append(t.outcome(f"c{i}", f"file {i}: " + "x " * words))
    return events


def _history(groups: int, words: int = 50) -> list:  # type: ignore[type-arg]
    return ledger_records(_events(Thread(), groups, words))


def measured(
    blocks: BlockSet, policy: CompactionPolicy, budget: int
) -> tuple[ViewMeasure, list[DraftBlock], dict[str, int]]:
    """The measure of a view of ``blocks`` alone (no summary, no state), as the budgeter takes it."""
    sizes = view_sizes(blocks.ready, counter_for("o200k_base"))
    return (*measure_view(blocks.ready, sizes, blocks, policy, budget), sizes)


def test_cover_counts_the_summary_it_replaces_once_and_the_new_one_at_its_cap() -> None:
    policy = CompactionPolicy(keep_recent_groups=1)
    blocks = build_view_blocks(_history(10))
    measure, eligible, sizes = measured(blocks, policy, 2_000)
    each = sizes[eligible[0].block_id]
    with_parent = ViewMeasure(measure.estimated + 300, measure.required, measure.compressible, measure.budget)
    small = choose_cover(
        eligible, with_parent, policy, sizes, ratio_hit=True, summary_allowance=50, current_summary=300
    )
    large = choose_cover(
        eligible,
        with_parent,
        policy,
        sizes,
        ratio_hit=True,
        summary_allowance=500,
        current_summary=300,
    )
    assert small is not None and large is not None
    # A bigger summary allowance means more history must go to reach the target, never less.
    assert len(large.blocks) >= len(small.blocks)
    target = int(policy.target_context_ratio * 2_000)

    # Left after a cover of k blocks: the view without the summary it replaces (counted once), minus
    # the blocks, plus the new summary at its allowance. Each cover is the smallest that reaches the target.
    def left(k: int, allowance: int) -> int:
        return with_parent.estimated - 300 - k * each + allowance

    assert [sizes[b.block_id] for b in eligible] == [each] * len(eligible)
    assert len(small.blocks) == 1 and left(0, 50) <= target  # already under it: the least a cover takes
    assert left(len(large.blocks), 500) <= target < left(len(large.blocks) - 1, 500)
    assert each > 0


def test_the_newest_tool_group_is_never_eligible_even_with_nothing_kept_or_a_turn_after_it() -> None:
    t = Thread()
    events = _events(t, 4)
    blocks = build_view_blocks(ledger_records(events))
    newest = [b for b in blocks.ready if b.block_id.startswith("group:")][-1]
    assert newest not in eligible_blocks(blocks, 0)
    assert len(eligible_blocks(blocks, 0)) == 3
    later = build_view_blocks(ledger_records([*events, t.assistant("Done: all four files read.")]))
    eligible = eligible_blocks(later, 0)
    # Coverage is a prefix: a text turn after the newest group cannot pull that group into it.
    assert newest.block_id not in [b.block_id for b in eligible]
    assert all(max(r.seq for r in b.records) < newest.records[0].seq for b in eligible)


def test_measure_counts_the_head_a_compaction_keeps_and_what_it_would_take_off_each_call() -> None:
    policy = CompactionPolicy(keep_recent_groups=1)
    blocks = build_view_blocks(_history(10))
    # A summary of 300 tokens in front of the history: it goes with the covered blocks.
    summary = replace(blocks.ready[-1], block_id="summary", kind=BlockKind.SUMMARY)
    shown = [summary, *blocks.ready]
    sizes = {**view_sizes(blocks.ready, counter_for("o200k_base")), "summary": 300 + MESSAGE_OVERHEAD}
    measure, eligible = measure_view(shown, sizes, blocks, policy, 8_000, reserved=40)
    head = [b for b in blocks.ready if b.kind in (BlockKind.INSTRUCTION, BlockKind.TASK)]
    assert len(head) == 2
    assert measure.stable == 40 + sum(sizes[b.block_id] for b in head)
    # The covered history and the current summary go; a summary at its cap takes their place.
    successor = summary_cap(policy, 8_000, measure.required) + MESSAGE_OVERHEAD
    assert measure.reducible == measure.compressible + 300 + MESSAGE_OVERHEAD - successor
    assert measure.compressible == sum(sizes[b.block_id] for b in eligible)


def test_measure_has_nothing_reducible_when_nothing_is_compressible() -> None:
    blocks = build_view_blocks(_history(1))
    measure, eligible, _ = measured(blocks, CompactionPolicy(), 8_000)
    assert eligible == [] and measure.reducible == 0
