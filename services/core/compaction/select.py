"""What a compaction covers: the oldest prefix of complete groups, never what must stay. Pure.

Kept out of every summary: instructions, the current request, material, open groups (and so
everything after the first open group), and the ``keep_recent_groups`` newest complete groups.
Coverage is a prefix by first seq, so a view shows "summary, then every later interaction".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from contracts import BlockKind, CompactionPolicy

from services.core.groups import BlockSet, DraftBlock
from services.core.render import MESSAGE_OVERHEAD, REPLY_PRIMING
from services.core.tokens import EncodingName, counter_for
from services.core.compaction.policy import ViewMeasure, ratio_threshold

# Blocks a context shows before its summary, which a compaction leaves as they are.
_HEAD_KINDS = frozenset({BlockKind.INSTRUCTION, BlockKind.TASK})

__all__ = [
    "CoverChoice",
    "block_tokens",
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


def block_tokens(block: DraftBlock, encoding: EncodingName) -> int:
    """What a block costs in the view, envelopes included: what the assembly counts for it whole,
    from the counts the block derived when it was built; a block written for the view (a handoff,
    the state facts) from its text, as the assembly counts it."""
    if block.records:
        content = block.record_tokens.get(encoding)
    else:
        content = sum(counter_for(encoding).count(m.content or "") for m in block.messages)
    return content + MESSAGE_OVERHEAD * len(block.messages) + block.id_counts.get(encoding)


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
    blocks: BlockSet,
    summary_tokens: int,
    policy: CompactionPolicy,
    encoding: EncodingName,
    budget: int,
    standing: Sequence[DraftBlock] = (),
    reserved: int = 0,
) -> tuple[ViewMeasure, list[DraftBlock]]:
    """The view's size, its required part, and what could be compacted now.

    ``standing``: the blocks a context shows beside the history and the summary (a window's
    handoff, the state facts), required and never compacted. ``reserved``: what a prepare sends
    beside the view (the tool schemas), counted as required and at the head of every context."""
    fixed = reserved + sum(block_tokens(b, encoding) for b in standing)
    shown = fixed + sum(block_tokens(b, encoding) for b in blocks.ready)
    required = fixed + sum(block_tokens(b, encoding) for b in blocks.ready if not b.droppable)
    stable = reserved + sum(block_tokens(b, encoding) for b in blocks.ready if b.kind in _HEAD_KINDS)
    summary = summary_tokens + (MESSAGE_OVERHEAD if summary_tokens else 0)
    eligible = eligible_blocks(blocks, policy.keep_recent_groups)
    compressible = sum(block_tokens(b, encoding) for b in eligible)
    # The summary replacing them is taken at its cap: summaries grow towards it.
    successor = summary_cap(policy, budget, required + REPLY_PRIMING) + MESSAGE_OVERHEAD
    return ViewMeasure(
        estimated=shown + summary + REPLY_PRIMING,
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
    encoding: EncodingName,
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
        covered += block_tokens(block, encoding)
    covered_to = max(r.seq for b in chosen for r in b.records)
    # Coverage is by first seq: every eligible block that starts inside the range is covered too.
    for block in eligible[len(chosen) :]:
        if block.records[0].seq > covered_to:
            break
        chosen.append(block)
        covered += block_tokens(block, encoding)
        covered_to = max(covered_to, *(r.seq for r in block.records))
    return CoverChoice(blocks=tuple(chosen), covered_to=covered_to, tokens=covered)


def split_segments(
    blocks: Sequence[DraftBlock], max_tokens: int, encoding: EncodingName
) -> list[list[DraftBlock]]:
    """Whole blocks packed in order into segments of at most ``max_tokens``
    (a lone bigger block gets its own)."""
    segments: list[list[DraftBlock]] = []
    current: list[DraftBlock] = []
    size = 0
    for block in blocks:
        t = block_tokens(block, encoding)
        if current and size + t > max_tokens:
            segments.append(current)
            current, size = [], 0
        current.append(block)
        size += t
    if current:
        segments.append(current)
    return segments
