"""What a compaction covers: the oldest prefix of complete groups, never what must stay. Pure.

Kept out of every summary: instructions, the current request, material, open groups (and so
everything after the first open group), and the ``keep_recent_groups`` newest complete groups.
Coverage is a prefix by first seq, so a view shows "summary, then every later interaction".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from contracts import BlockKind, CompactionPolicy

from services.core.assemble import block_size
from services.core.groups import BlockSet, DraftBlock
from services.core.render import MESSAGE_OVERHEAD, REPLY_PRIMING
from services.core.tokens import TokenCounter
from services.core.compaction.policy import ViewMeasure, ratio_threshold

# Blocks a context shows before its summary, which a compaction leaves as they are.
_HEAD_KINDS = frozenset({BlockKind.INSTRUCTION, BlockKind.TASK})

__all__ = [
    "CoverChoice",
    "choose_cover",
    "eligible_blocks",
    "measure_view",
    "split_segments",
    "summary_cap",
]


@dataclass(frozen=True)
class CoverChoice:
    """The blocks a compaction covers (oldest first) and the new ``covered_to`` seq."""

    blocks: tuple[DraftBlock, ...]
    covered_to: int
    tokens: int


def eligible_blocks(blocks: BlockSet, keep_recent: int) -> list[DraftBlock]:
    """Shown interaction blocks that may be covered, oldest first."""
    interactions = [b for b in blocks.ready if b.kind is BlockKind.INTERACTION]
    if keep_recent:
        interactions = interactions[:-keep_recent]
    # Coverage is a prefix by seq: it ends before the first open group, and before the newest
    # complete tool group whatever follows it — the model must see the result of its last action.
    stops = [b.records[0].seq for b in blocks.held]
    stops += [b.records[0].seq for b in blocks.ready if b.block_id.startswith("group:")][-1:]
    stop = min(stops, default=None)
    return [b for b in interactions if stop is None or max(r.seq for r in b.records) < stop]


def measure_view(
    shown: Sequence[DraftBlock],
    sizes: Mapping[str, int],
    blocks: BlockSet,
    policy: CompactionPolicy,
    budget: int,
    reserved: int = 0,
) -> tuple[ViewMeasure, list[DraftBlock]]:
    """The view's size, its required part, and what could be compacted now.

    ``shown``: every block a context of the view shows (``services.core.assemble.shown_blocks``),
    ``sizes`` their tokens (``view_sizes``); ``blocks``: the view's ledger blocks, whose complete
    groups may be covered. The summary is not required: a smaller one may replace it.
    ``reserved``: what a prepare sends beside the view (the tool schemas), counted as required and
    at the head of every context."""
    required = reserved + sum(
        sizes[b.block_id] for b in shown if not b.droppable and b.kind is not BlockKind.SUMMARY
    )
    stable = reserved + sum(sizes[b.block_id] for b in shown if b.kind in _HEAD_KINDS)
    summary = sum(sizes[b.block_id] for b in shown if b.kind is BlockKind.SUMMARY)
    eligible = eligible_blocks(blocks, policy.keep_recent_groups)
    compressible = sum(sizes[b.block_id] for b in eligible)
    # The summary replacing them is taken at its cap: summaries grow towards it.
    successor = summary_cap(policy, budget, required + REPLY_PRIMING) + MESSAGE_OVERHEAD
    return ViewMeasure(
        estimated=reserved + sum(sizes[b.block_id] for b in shown) + REPLY_PRIMING,
        required=required + REPLY_PRIMING,
        compressible=compressible,
        budget=budget,
        stable=stable,
        reducible=compressible + summary - successor if compressible else 0,
    ), eligible


def summary_cap(policy: CompactionPolicy, budget: int, required: int) -> int:
    """The most tokens a summary may render to: its policy share of the budget, and never more than
    half of what the required content leaves free — the other half is for recent history,
    so a large system prompt at a tight budget shrinks the summary instead of crowding out the
    result of the model's last action."""
    share = math.floor(Fraction(str(policy.summary_ratio)) * budget)
    return max(0, min(share, (budget - required) // 2))


def choose_cover(
    eligible: Sequence[DraftBlock],
    measure: ViewMeasure,
    policy: CompactionPolicy,
    sizes: Mapping[str, int],
    *,
    ratio_hit: bool,
    summary_allowance: int | None = None,
    current_summary: int = 0,
) -> CoverChoice | None:
    """The oldest prefix to cover: enough to reach the target (ratio trigger), else all eligible.

    ``summary_allowance`` is the room the new summary will take (its cap); ``current_summary`` what
    the summary it replaces takes in ``measure.estimated`` now.
    """
    if not eligible:
        return None
    target = ratio_threshold(policy.target_context_ratio, measure.budget)
    allowance = measure.budget // 20 if summary_allowance is None else summary_allowance
    chosen: list[DraftBlock] = []
    covered = 0
    for block in eligible:
        if ratio_hit and chosen and measure.estimated - current_summary - covered + allowance <= target:
            break
        chosen.append(block)
        covered += sizes[block.block_id]
    covered_to = max(r.seq for b in chosen for r in b.records)
    # Coverage is by first seq: every eligible block that starts inside the range is covered too.
    for block in eligible[len(chosen) :]:
        if block.records[0].seq > covered_to:
            break
        chosen.append(block)
        covered += sizes[block.block_id]
        covered_to = max(covered_to, *(r.seq for r in block.records))
    return CoverChoice(blocks=tuple(chosen), covered_to=covered_to, tokens=covered)


def split_segments(
    blocks: Sequence[DraftBlock], max_tokens: int, counter: TokenCounter
) -> list[list[DraftBlock]]:
    """Whole blocks packed in order into segments of at most ``max_tokens`` of what the summarizer
    reads, every output in full (a lone bigger block gets its own)."""
    segments: list[list[DraftBlock]] = []
    current: list[DraftBlock] = []
    size = 0
    for block in blocks:
        t = block_size(block, counter)
        if current and size + t > max_tokens:
            segments.append(current)
            current, size = [], 0
        current.append(block)
        size += t
    if current:
        segments.append(current)
    return segments
