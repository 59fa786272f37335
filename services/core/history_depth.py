"""How deep into its summaries a prepare shows a thread's history. Pure.

A committed summary is a view of the ledger, not a deletion: the records it covers stay, and a
prepare whose budget holds them shows them. A thread's depths, least compressed first, are its
records in full, each earlier summary of the chain its committed one extends (each covers a longer
prefix of the ledger), and the committed summary. A prepare whose budget is larger than the
one the summary was made for starts at the least compressed depth whose history, every output at
its preview, fits its own budget, and goes one deeper only when assembly says the view does not fit
there — so a summary a small budget needed never lowers what a larger budget sees (docs/design.md,
"Every budget sees the least compressed history that fits it"). "Depth", not "level": a water level
is a context's share of its budget (``services/core/water_levels.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from services.core.assemble import SummaryView, ThreadSnapshot
from services.core.records import LedgerRecord

__all__ = ["depths_of", "first_depth", "in_full", "smallest_history"]


def depths_of(snapshot: ThreadSnapshot, earlier: Sequence[SummaryView] = ()) -> tuple[ThreadSnapshot, ...]:
    """``snapshot`` at each depth, least compressed first: its records in full, then each of the
    ``earlier`` summaries its committed one extends (oldest first), then the view as committed.

    A later window starts from its handoff, not from the records a summary covers: it has one depth.
    """
    if snapshot.summary is None or snapshot.handoff is not None:
        return (snapshot,)
    shallower = tuple(replace(snapshot, summary=s, covered_to=s.covered_to) for s in earlier)
    return (in_full(snapshot), *shallower, snapshot)


def in_full(snapshot: ThreadSnapshot) -> ThreadSnapshot:
    """``snapshot`` with no summary in place of any record: its whole history. A later window's is its
    handoff and every record since (what the closed windows held stays closed)."""
    covered_to = snapshot.handoff.last_event_seq if snapshot.handoff is not None else 0
    return replace(snapshot, summary=None, covered_to=covered_to)


def smallest_history(
    records: Sequence[LedgerRecord], encoding: str, summary: SummaryView | None = None
) -> int:
    """Tokens of ``records`` shown beside ``summary`` (those it does not cover, and the summary's
    text), every output shortened to its preview: no reduction but compaction makes them smaller."""
    total = 0
    if summary is not None:
        total = summary.tokens(encoding)
        records = [r for r in records if not summary.covered_from <= r.seq <= summary.covered_to]
    for r in records:
        counts = r.mask_tokens if r.mask_tokens is not None else r.tokens
        total += counts.cl100k_base if encoding == "cl100k_base" else counts.o200k_base
    return total


def first_depth(depths: Sequence[ThreadSnapshot], input_budget: int, encoding: str, *, made_for: int) -> int:
    """Where a prepare of ``input_budget`` starts: the view as committed (the last of ``depths``) when
    its summary was made for this budget or a larger one (``made_for``: the budget the thread compacts
    ahead of), else the least compressed depth whose history at its smallest fits ``input_budget``."""
    if input_budget <= made_for:
        return len(depths) - 1
    for n, depth in enumerate(depths[:-1]):
        if smallest_history(depth.records, encoding, depth.summary) <= input_budget:
            return n
    return len(depths) - 1
