"""The summary region: the committed summary text as the parts a context shows. Pure.

A context shows the summary after its stable head, so a compaction that rewrote the summary would
cost the provider's prompt cache everything from there on. A compaction whose new part fits the
region's share of the budget appends that part instead (``next_region``): the parts already shown
stay byte-identical, each its own message (``summary_parts``), and only the new part and what
follows it are new to the cache. When the region outgrows its share, one roll-up rewrites it as a
single part — the summary's guarantees (``fit_summary``: what must survive, the skeleton as the
last rung) apply to it as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from services.core.compaction.merge import render_summary
from services.core.compaction.model import StructuredSummary
from services.core.compaction.rollup import fit_summary

__all__ = ["PART_BREAK", "Region", "delta_of", "next_region", "rolled_up", "summary_parts"]

# Between two parts of the region's text; the assembler shows each part as a message of its own.
PART_BREAK = "\n\n"
# Only a continuation header (``render_summary(..., continues=...)``) opens a part after the first.
_NEXT_PART = re.compile(r"\n\n(?=\[context summary r\d+, continuing r\d+: records )")


@dataclass(frozen=True, slots=True)
class Region:
    """The summary a compaction commits: its body (what the next one merges into) and its text."""

    body: StructuredSummary
    text: str
    # Whether ``text`` keeps the previous region's text as its prefix.
    appended: bool


def summary_parts(text: str) -> tuple[str, ...]:
    """The parts of a region's text, oldest first, as appended (one part for a rolled-up region)."""
    return tuple(_NEXT_PART.split(text))


def delta_of(own: StructuredSummary, parent: StructuredSummary) -> StructuredSummary:
    """``own`` (what one compaction's records say) without what the part above already quotes:
    the same goal, the same constraints."""
    goal = (
        None
        if own.goal is not None and parent.goal is not None and own.goal.text == parent.goal.text
        else own.goal
    )
    quoted = {c.text for c in parent.constraints}
    return own.model_copy(
        update={"goal": goal, "constraints": tuple(c for c in own.constraints if c.text not in quoted)}
    )


def next_region(
    merged: StructuredSummary,
    *,
    max_tokens: int,
    count: Callable[[str], int],
    revision: int,
    pinned: Collection[int] = (),
    previous: tuple[str, int, StructuredSummary] | None = None,
    own: StructuredSummary | None = None,
) -> Region:
    """The region after a compaction: the previous text with ``own`` appended as a new part when
    the whole still fits ``max_tokens``, else ``merged`` rolled up to fit as one part.

    ``previous``: the committed region's text, its revision and its body; ``own``: the summary of
    this compaction's records alone. ``merged`` (the previous body and ``own`` as one summary) is
    the body either way: it cites every record the appended text does.
    """
    if previous is not None and own is not None:
        text, previous_revision, body = previous
        part = render_summary(
            delta_of(own, body), revision=revision, pinned=pinned, continues=previous_revision
        )
        appended = text + PART_BREAK + part
        if count(appended) <= max_tokens:
            return Region(merged, appended, appended=True)
    return rolled_up(merged, max_tokens=max_tokens, count=count, revision=revision, pinned=pinned)


def rolled_up(
    merged: StructuredSummary,
    *,
    max_tokens: int,
    count: Callable[[str], int],
    revision: int,
    pinned: Collection[int] = (),
) -> Region:
    """``merged`` rolled up to ``max_tokens`` and rendered as the region's one part."""
    fitted = fit_summary(merged, max_tokens=max_tokens, count=count, revision=revision, pinned=pinned)
    return Region(fitted, render_summary(fitted, revision=revision, pinned=pinned), appended=False)
