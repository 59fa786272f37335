"""``ctxfleet context``'s breakdown of a prepared context (golden replies as input, no servers)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from contracts import PreparedContext, SummaryRef
from infra.cli_context import breakdown, render

GOLDEN = Path(__file__).parent.parent / "golden" / "prepare"


def _golden(name: str) -> PreparedContext:
    return PreparedContext.model_validate(json.loads((GOLDEN / f"{name}.json").read_text())["expected"])


def test_breakdown_categories_add_up_to_the_tokens_the_budget_report_says_are_used() -> None:
    prepared = _golden("tight_budget_drops_history_and_trims_newest_group")
    shown = breakdown(prepared)
    assert sum(c.tokens for c in shown.categories) == prepared.budget_report.used.total == shown.used
    assert shown.free == prepared.budget_report.input_budget - shown.used


def test_breakdown_lists_each_block_with_its_reason_and_share_and_each_omission_with_why() -> None:
    prepared = _golden("tight_budget_drops_history_and_trims_newest_group")
    shown = breakdown(prepared)
    budget = prepared.budget_report.input_budget
    assert [(b.block_id, b.tokens, b.reason) for b in shown.blocks] == [
        (b.block_id, b.tokens, b.reason) for b in prepared.blocks
    ]
    assert [b.share for b in shown.blocks] == [round(100 * b.tokens / budget, 1) for b in prepared.blocks]
    assert [(o.block_id, o.reason) for o in shown.omitted] == [
        (o.block_id, o.reason) for o in prepared.omitted
    ]
    assert len(shown.omitted) == 3


def test_breakdown_shows_the_summary_coverage_when_the_context_has_a_summary() -> None:
    prepared = _golden("coding_turn_with_trimmed_result").model_copy(
        update={
            "summary": SummaryRef(
                summary_id="s1", view_revision=2, covered_from=3, covered_to=9, sources=(3, 5, 9)
            )
        }
    )
    shown = breakdown(prepared)
    assert shown.summary is not None
    assert (shown.summary.covered_from, shown.summary.covered_to, shown.summary.sources) == (3, 9, 3)
    assert shown.as_json()["summary"] == {
        "summary_id": "s1",
        "view_revision": 2,
        "covered_from": 3,
        "covered_to": 9,
        "sources": 3,
    }


def test_render_draws_the_bar_every_block_and_what_was_left_out() -> None:
    prepared = _golden("tight_budget_drops_history_and_trims_newest_group")
    out = io.StringIO()
    render(breakdown(prepared), Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert "█" in text and "free" in text
    for block in (*prepared.blocks, *prepared.omitted):
        assert block.block_id in text
    assert "why it was left out" in text
