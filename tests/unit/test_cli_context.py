"""``ctxfleet context``'s breakdown of a prepared context (golden replies as input, no servers)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from contracts import PreparedContext, SummaryRef
from contracts.prepare import HookTouch
from infra.cli_context import breakdown, render
from tests.fixtures.builders import summary_hook

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


def test_breakdown_counts_the_records_a_summary_covers_apart_from_those_it_cites() -> None:
    # It cites the run's task (record 2), shown in full beside it: 7 records covered, 4 cited.
    prepared = _golden("coding_turn_with_trimmed_result").model_copy(
        update={
            "summary": SummaryRef(
                summary_id="s1", view_revision=2, covered_from=3, covered_to=9, sources=(2, 3, 5, 9)
            )
        }
    )
    shown = breakdown(prepared)
    assert shown.summary is not None
    assert shown.as_json()["summary"] == {
        "summary_id": "s1",
        "view_revision": 2,
        "covered_from": 3,
        "covered_to": 9,
        "records": 7,
        "cited": 4,
        "hooks": (),
    }
    out = io.StringIO()
    render(shown, Console(file=out, width=160, color_system=None))
    assert "covers records #3–#9 (7 records), citing 4 records" in out.getvalue()


def test_breakdown_with_texts_shows_each_block_as_the_model_reads_its_messages() -> None:
    prepared = _golden("coding_turn_with_trimmed_result")
    shown = breakdown(prepared, texts=True)
    assert [t.block_id for t in shown.texts] == [b.block_id for b in prepared.blocks]
    for block, text in zip(prepared.blocks, shown.texts, strict=True):
        for m in prepared.messages[block.first_message : block.first_message + block.message_count]:
            assert f"[{m.role}" in text.text and (m.content or "") in text.text
    out = io.StringIO()
    render(shown, Console(file=out, width=160, color_system=None))
    assert prepared.messages[-1].content and prepared.messages[-1].content.splitlines()[0] in out.getvalue()
    assert breakdown(prepared).texts == ()


def test_render_draws_the_bar_every_block_and_what_was_left_out() -> None:
    prepared = _golden("tight_budget_drops_history_and_trims_newest_group")
    out = io.StringIO()
    render(breakdown(prepared), Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert "█" in text and "free" in text
    for block in (*prepared.blocks, *prepared.omitted):
        assert block.block_id in text
    assert "why it was left out" in text


_SCOPE = summary_hook("scope", "context.compact.before", "range 3–20 → 3–9")


def _hooked() -> PreparedContext:
    """A context two prepare hooks touched, showing a summary a compact.before hook narrowed."""
    return _golden("coding_turn_with_trimmed_result").model_copy(
        update={
            "summary": SummaryRef(
                summary_id="s1", view_revision=2, covered_from=3, covered_to=9, sources=(3,), hooks=(_SCOPE,)
            ),
            "hooks": (
                HookTouch(source="policy@2", point="context.prepare.before", outcome="patched"),
                HookTouch(
                    source="audit@1",
                    point="context.prepare.after",
                    outcome="annotated",
                    note="2 materials checked against the tenant's policy",
                ),
            ),
        }
    )


def test_breakdown_json_lists_the_hooks_that_ran_and_those_that_shaped_the_summary() -> None:
    shown = json.loads(json.dumps(breakdown(_hooked()).as_json()))
    assert shown["hooks"] == [
        {"source": "policy@2", "point": "context.prepare.before", "outcome": "patched", "note": ""},
        {
            "source": "audit@1",
            "point": "context.prepare.after",
            "outcome": "annotated",
            "note": "2 materials checked against the tenant's policy",
        },
    ]
    assert shown["summary"]["hooks"] == [
        {
            "source": "scope@1",
            "point": "context.compact.before",
            "subject": "hooks.default.scope",
            "release": "rel-1",
            "hook_set_revision": 2,
            "change": "range 3–20 → 3–9",
        }
    ]


def test_render_shows_each_hook_with_its_annotation_and_the_hook_that_narrowed_the_summary() -> None:
    out = io.StringIO()
    render(breakdown(_hooked()), Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert "2 materials checked against the tenant's policy" in text
    assert "context.prepare.before" in text and "patched" in text
    assert (
        "shaped by hook scope@1 at context.compact.before (subject hooks.default.scope, hook set rel-1 r2): "
        "range 3–20 → 3–9" in text
    )


def test_a_context_no_hook_touched_shows_no_hooks_table() -> None:
    out = io.StringIO()
    prepared = _golden("coding_turn_with_trimmed_result")
    render(breakdown(prepared), Console(file=out, width=160, color_system=None))
    assert breakdown(prepared).hooks == () and "outcome" not in out.getvalue()
