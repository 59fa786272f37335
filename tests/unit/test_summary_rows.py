"""The store's held summaries: one per thread, the newest first to stay, bounded by bytes."""

from __future__ import annotations

import pytest

from services.core.compaction.model import SourcedText, StructuredSummary
from services.store import views
from services.store.views import SummaryRow, SummaryRows


def _row(summary_id: str) -> SummaryRow:
    body = StructuredSummary(covered_from=1, covered_to=4)
    return SummaryRow(summary_id, body, f"summary {summary_id}", 10, 11)


def test_a_thread_holds_its_newest_summary_only() -> None:
    rows = SummaryRows(max_bytes=1_000)
    rows.keep("r1.main", _row("s1"), 300)
    rows.keep("r1.main", _row("s2"), 400)
    held = rows.held("r1.main")
    assert held is not None and held.summary_id == "s2"
    assert rows.bytes == 400


def test_the_least_recently_read_threads_leave_first_once_the_bytes_are_spent() -> None:
    rows = SummaryRows(max_bytes=1_000)
    rows.keep("a", _row("sa"), 400)
    rows.keep("b", _row("sb"), 400)
    assert rows.held("a") is not None  # read: now the most recent
    rows.keep("c", _row("sc"), 400)
    assert rows.held("b") is None
    assert rows.held("a") is not None and rows.held("c") is not None
    assert rows.bytes == 800


def test_a_summary_larger_than_the_whole_bound_is_not_held_and_drops_the_older_one() -> None:
    rows = SummaryRows(max_bytes=1_000)
    rows.keep("a", _row("s1"), 300)
    rows.keep("a", _row("s2"), 5_000)
    assert rows.held("a") is None and rows.bytes == 0


def test_a_summary_rows_cited_seqs_are_walked_once_when_it_is_read_not_on_every_prepare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walks: list[StructuredSummary] = []
    real = views.summary_sources

    def counted(body: StructuredSummary) -> list[int]:
        walks.append(body)
        return real(body)

    monkeypatch.setattr(views, "summary_sources", counted)
    body = StructuredSummary(
        covered_from=1,
        covered_to=9,
        goal=SourcedText(text="fix the import", sources=(2,)),
        decisions=(SourcedText(text="pin the version", sources=(7, 4)), SourcedText(text="x", sources=(4,))),
    )
    row = SummaryRow("s1", body, "summary", 10, 11)
    assert (row.sources, row.sources) == ((2, 4, 7), (2, 4, 7))
    assert walks == [body]
