"""The summary region: a compaction appends its part after the summary a context shows, until the
region outgrows its share and one roll-up rewrites it — no I/O."""

from __future__ import annotations

from typing import Any

from services.core.compaction.merge import merge_summaries, render_summary
from services.core.compaction.model import SourcedText, StructuredSummary
from services.core.compaction.region import delta_of, next_region, summary_parts
from services.core.compaction.rollup import fit_summary
from services.core.providers.anthropic_messages import anthropic_request, cache_breakpoints
from services.core.tokens import counter_for
from tests.fixtures.builders import Thread, ledger_records
from tests.unit.test_provider_anthropic import BASH, _bundle, _marked_sources, _prepare, _summary

COUNT = counter_for("o200k_base").count
GOAL = SourcedText(text="Fix the failing test in app.py", sources=(2,))


def _part(first: int, last: int, **fields: Any) -> StructuredSummary:
    steps = tuple(
        SourcedText(text=f"bash(cat f{n}) → success: out {n}", sources=(n,)) for n in range(first, last + 1)
    )
    return StructuredSummary(
        covered_from=first,
        covered_to=last,
        goal=GOAL,
        progress=steps,
        next_steps=(SourcedText(text=f"read f{last + 1}", sources=(last,)),),
        **fields,
    )


def _committed(body: StructuredSummary, revision: int) -> tuple[str, int, StructuredSummary]:
    return render_summary(body, revision=revision), revision, body


def test_a_compaction_that_fits_keeps_the_shown_summary_as_its_prefix_and_appends_its_own_part() -> None:
    first = _part(3, 6)
    own = _part(7, 10)
    previous = _committed(first, 1)
    region = next_region(
        merge_summaries(first, own), max_tokens=2_000, count=COUNT, revision=2, previous=previous, own=own
    )
    assert region.appended and region.text.startswith(previous[0])
    parts = summary_parts(region.text)
    assert parts[0] == previous[0] and len(parts) == 2
    assert parts[1].startswith("[context summary r2, continuing r1: records 7–10 condensed")
    # The part cites the records it covers; the body it commits cites every record the text does.
    assert "(seq 7)" in parts[1] and "(seq 3)" not in parts[1]
    assert {3, 7, 10} <= {s for p in region.body.progress for s in p.sources}
    # A third compaction appends again: both earlier parts stay as they were.
    third = _part(11, 12)
    again = next_region(
        merge_summaries(region.body, third),
        max_tokens=2_000,
        count=COUNT,
        revision=3,
        previous=(region.text, 2, region.body),
        own=third,
    )
    assert summary_parts(again.text)[:2] == parts and len(summary_parts(again.text)) == 3


def test_a_region_past_its_share_is_rolled_up_into_one_fitted_part() -> None:
    first = _part(3, 6)
    own = _part(7, 40)
    merged = merge_summaries(first, own)
    previous = _committed(first, 1)
    cap = COUNT(previous[0]) + 50
    region = next_region(merged, max_tokens=cap, count=COUNT, revision=2, previous=previous, own=own)
    fitted = fit_summary(merged, max_tokens=cap, count=COUNT, revision=2)
    assert not region.appended and region.body == fitted
    assert summary_parts(region.text) == (render_summary(fitted, revision=2),)
    assert COUNT(region.text) <= cap


def test_an_appended_part_does_not_repeat_the_goal_or_constraints_the_part_above_quotes() -> None:
    rule = SourcedText(text="You must not change the public API.", sources=(2,))
    new_rule = SourcedText(text="Run pytest after editing.", sources=(8,))
    parent = _part(3, 6, constraints=(rule,))
    delta = delta_of(_part(7, 9, constraints=(rule, new_rule)), parent)
    assert delta.goal is None and delta.constraints == (new_rule,)


def test_the_context_shows_each_summary_part_as_its_own_message_after_an_unchanged_prefix() -> None:
    t = Thread()
    events: list[Any] = [t.system("Rules."), t.user("Fix the failing test in app.py")]
    for n in range(6):
        events += [
            t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat f{n}"}),)),
            t.outcome(f"c{n}", f"out {n}"),
        ]
    records = ledger_records(events)
    first = "[context summary r1: records 3–6 condensed]\nRead f0 and f1: both fine. (seq 4)"
    second = "[context summary r2, continuing r1: records 7–10 condensed]\nRead f2 and f3: fine. (seq 8)"
    before = _prepare(t, records, summary=_summary(records, 6, first), tools=[BASH])
    after = _prepare(t, records, summary=_summary(records, 10, f"{first}\n\n{second}"), tools=[BASH])
    at = next(n for n, m in enumerate(before.messages) if m.content == first)
    assert after.messages[: at + 1] == before.messages[: at + 1]
    assert after.messages[at + 1].content == second
    # The head's cache breakpoint ends the region: after its newest part, which the previous request's
    # breakpoint (after the part above it) is a cached prefix of.
    marks = cache_breakpoints(after.messages, after.blocks)
    assert at + 2 in marks and at + 1 in cache_breakpoints(before.messages, before.blocks)
    assert {n - 1 for n in marks} == _marked_sources(
        anthropic_request(_bundle(after, records)), after.messages
    )
