"""Rolling a summary up to its share of the budget: it fits, keeps what must survive, and converges."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.core.compaction.merge import (
    fold_actions,
    fold_progress,
    latest_failures,
    merge_summaries,
    render_summary,
)
from services.core.compaction.model import StructuredSummary
from services.core.compaction.rollup import SKELETON_ACTIONS, fit_summary, rollup_ladder, skeleton
from services.core.compaction.structured import summarize_records
from services.core.records import LedgerRecord
from services.core.render import TokenCounts
from services.core.tokens import counter_for

COUNT = counter_for("o200k_base").count
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILES = [f"src/pkg/module_{n}.py" for n in range(10)]
TESTS = [f"tests/test_module_{n}.py" for n in range(4)]

# One synthetic step: (kind, which file/test/pattern, variant). Kinds cover every ledger field.
Step = tuple[str, int, int]
steps_strategy = st.lists(
    st.tuples(
        st.sampled_from(["read", "view", "edit", "test", "grep", "say", "act"]),
        st.integers(0, 9),
        st.integers(0, 3),
    ),
    min_size=5,
    max_size=120,
)


def _records(steps: Sequence[Step]) -> list[LedgerRecord]:
    """A coding thread: a task with constraints, then one tool group (or a message) per step."""
    records: list[LedgerRecord] = []

    def add(kind: str, text: str, **payload: Any) -> None:
        seq = len(records) + 1
        records.append(
            LedgerRecord(
                seq,
                f"k{seq}",
                kind,
                {"text": text, **payload},
                text,
                TokenCounts(o200k_base=1, cl100k_base=1),
            )
        )

    def group(
        n: int, name: str, args: dict[str, Any], output: str, status: str = "success", text: str = ""
    ) -> None:
        add("assistant_message", text, tool_calls=[{"call_id": f"call_{n}", "name": name, "args": args}])
        add("tool_outcome", output, call_id=f"call_{n}", status=status)

    add(
        "user_input",
        "Fix the crash in src/pkg/module_0.py. You must not change the public API. Run the tests after "
        "every edit.",
    )
    for n, (kind, which, variant) in enumerate(steps):
        path = FILES[which]
        if kind == "read":
            group(
                n,
                "bash",
                {"command": f"sed -n '{variant * 10 + 1},{variant * 10 + 40}p' {path}"},
                f"def f{variant}():\n    return {which}",
            )
        elif kind == "view":
            group(n, "str_replace_editor", {"command": "view", "path": path}, f"contents {which}.{variant}")
        elif kind == "edit":
            args = {
                "command": "str_replace",
                "path": path,
                "old_str": f"return {variant}",
                "new_str": f"return {variant + 1}",
            }
            group(
                n, "str_replace_editor", args, "edited", text=f"I will change the return value of f{variant}."
            )
        elif kind == "test":
            failed = variant != 0
            output = (
                f"E   AssertionError: {variant} != 0\nFAILED {TESTS[which % 4]}::test_{variant}"
                if failed
                else "3 passed"
            )
            group(
                n,
                "bash",
                {"command": f"python -m pytest -x {TESTS[which % 4]}"},
                output,
                "error" if failed else "success",
            )
        elif kind == "grep":
            found = variant % 2 == 0
            group(
                n,
                "bash",
                {"command": f"grep -n 'name_{which}' {path}"},
                f"{which}: name_{which}" if found else "",
                "success" if found else "error",
            )
        elif kind == "act":
            group(
                n,
                "move_item",
                {"item_id": which, "location": f"shelf_{variant}"},
                f'{{"location": "shelf_{variant}", "ok": true}}',
            )
        else:
            add(
                "assistant_message",
                f"The problem is that f{which} returns {variant}. Is module_{which} still used?",
            )
    return records


def _chunks(records: Sequence[LedgerRecord], size: int) -> list[list[LedgerRecord]]:
    """Whole groups per compaction: a chunk never ends between a call and its outcome."""
    chunks: list[list[LedgerRecord]] = [[]]
    for record in records:
        if record.kind != "tool_outcome" and len(chunks[-1]) >= size:
            chunks.append([])
        chunks[-1].append(record)
    return [c for c in chunks if c]


def _merged(records: Sequence[LedgerRecord], chunk: int) -> StructuredSummary:
    summary: StructuredSummary | None = None
    for part in _chunks(records, chunk):
        summary = merge_summaries(summary, summarize_records(part, current_request=records[0]))
    assert summary is not None
    return summary


def _tokens(summary: StructuredSummary) -> int:
    return COUNT(render_summary(summary, revision=7))


def _assert_survives(original: StructuredSummary, fitted: StructuredSummary) -> None:
    assert (fitted.goal, fitted.current_request) == (original.goal, original.current_request)
    assert fitted.constraints == original.constraints and fitted.next_steps == original.next_steps
    assert [t.path for t in fitted.files_modified] == [t.path for t in original.files_modified]
    assert latest_failures(fitted) == latest_failures(original)
    text = render_summary(fitted, revision=7)
    listed = text.split("Files modified", 1)[-1]
    assert all(
        re.search(rf"(^- |: |; ){re.escape(t.path)}[ :]", listed, re.M) for t in original.files_modified
    )
    assert all(f.detail in text for f in latest_failures(original))
    assert all(
        c.text in text for c in original.constraints if c.sources != (1,)
    )  # the request's own are shown with it
    kept = skeleton(original)
    assert all(f"- {a.tool} {a.args} → " in text for a in kept.actions)
    folded = (fitted.actions_folded.steps if fitted.actions_folded else 0) + len(fitted.actions)
    assert folded == (original.actions_folded.steps if original.actions_folded else 0) + len(original.actions)


@PROPERTY
@given(steps=steps_strategy, chunk=st.integers(4, 30), share=st.floats(0.0, 1.2))
def test_fit_summary_renders_within_budget_whenever_the_skeleton_does_and_keeps_what_must_survive(
    steps: list[Step], chunk: int, share: float
) -> None:
    summary = _merged(_records(steps), chunk)
    floor, full = _tokens(skeleton(summary)), _tokens(summary)
    budget = floor + int(share * max(0, full - floor))
    fitted = fit_summary(summary, max_tokens=budget, count=COUNT, revision=7)
    assert _tokens(fitted) <= budget
    _assert_survives(summary, fitted)
    assert fit_summary(summary, max_tokens=budget, count=COUNT, revision=7) == fitted  # deterministic
    assert fit_summary(fitted, max_tokens=budget, count=COUNT, revision=7) is fitted  # rolled up: stable


@PROPERTY
@given(steps=steps_strategy)
def test_the_skeleton_keeps_only_what_must_survive_and_is_what_an_impossible_budget_gets(
    steps: list[Step],
) -> None:
    summary = _merged(_records(steps), 12)
    bare = skeleton(summary)
    _assert_survives(summary, bare)
    assert (
        bare.progress,
        bare.folded,
        bare.decisions,
        bare.files_read,
        bare.commands,
        bare.approaches_failed,
    ) == ((), None, (), (), (), ())
    assert bare.failures == latest_failures(summary)
    assert fit_summary(summary, max_tokens=_tokens(bare) - 1, count=COUNT, revision=7) == bare
    assert skeleton(bare) == bare


def test_a_summary_that_fits_is_returned_as_it_is() -> None:
    summary = _merged(_records([("edit", 1, 0), ("test", 1, 1)]), 10)
    assert fit_summary(summary, max_tokens=_tokens(summary), count=COUNT, revision=7) is summary


def test_every_rung_of_the_ladder_only_removes_and_the_last_is_the_skeleton() -> None:
    steps = (
        [("read", n % 10, n % 4) for n in range(30)]
        + [("test", n % 4, n % 3) for n in range(20)]
        + [("edit", 3, 1), ("say", 2, 2)]
    )
    summary = _merged(_records(steps), 9)
    current = summary
    for rung in rollup_ladder():
        smaller = rung(current)
        assert len(render_summary(smaller, revision=7)) <= len(render_summary(current, revision=7)), rung
        current = smaller
    assert current == skeleton(summary)


def test_older_progress_folds_into_counts_and_ranges_per_tool() -> None:
    steps: list[Step] = [
        ("test", 0, 1),
        ("edit", 1, 0),
        ("test", 0, 0),
        ("grep", 2, 1),
        ("read", 3, 0),
        ("edit", 4, 2),
    ]
    records = _records(steps)
    summary = summarize_records(records)
    folded = fold_progress(summary, keep=2)
    older = summary.progress[:-2]
    tools = [p.text.split("(", 1)[0] for p in older]
    failed = sum(" → error" in p.text for p in older)
    first, last = older[0].sources[0], older[-1].sources[-1]
    assert folded.progress == summary.progress[-2:]
    assert folded.folded is not None and (folded.folded.first, folded.folded.last, folded.folded.steps) == (
        first,
        last,
        len(older),
    )
    line = (
        f"- records {first}–{last}: {len(older)} steps — bash ×{tools.count('bash')} ({failed} failed), "
        f"str_replace_editor ×{tools.count('str_replace_editor')}"
    )
    assert line in render_summary(folded, revision=1)
    refolded = fold_progress(folded, keep=0)
    assert refolded.folded is not None and refolded.folded.steps == len(summary.progress)


def _converge(steps: Sequence[Step], chunk: int, budget: int, *, require_room: bool = True) -> list[int]:
    """Repeated compactions: each covers the next chunk, merges it into the parent and fits the budget."""
    records = _records(steps)
    summary: StructuredSummary | None = None
    sizes = []
    for part in _chunks(records, chunk):
        merged = merge_summaries(summary, summarize_records(part, current_request=records[0]))
        if _tokens(skeleton(merged)) > budget:
            assert not require_room, "the synthetic thread must leave room for its skeleton"
            return []
        summary = fit_summary(merged, max_tokens=budget, count=COUNT, revision=7)
        sizes.append(_tokens(summary))
    return sizes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["read", "view", "edit", "test", "grep", "say", "act"]),
            st.integers(0, 9),
            st.integers(0, 3),
        ),
        min_size=150,
        max_size=300,
    ),
    chunk=st.integers(6, 40),
    input_budget=st.sampled_from([4_000, 8_000]),
)
def test_repeated_compaction_of_any_thread_stays_within_the_summary_share(
    steps: list[Step], chunk: int, input_budget: int
) -> None:
    budget = input_budget // 4
    sizes = _converge(steps, chunk, budget, require_room=False)
    assume(sizes)
    assert max(sizes) <= budget


def _thousand_steps() -> list[Step]:
    kinds = ["read", "test", "view", "edit", "grep", "test", "say", "read", "grep", "act"]
    return [(kinds[n % len(kinds)], (n * 7) % 10, (n * 3) % 4) for n in range(1_000)]


def test_a_thousand_steps_of_repeated_compaction_never_exceed_the_summary_share_at_any_budget() -> None:
    for input_budget in (4_000, 8_000, 16_000):
        budget = int(0.25 * input_budget)
        sizes = _converge(_thousand_steps(), chunk=20, budget=budget)
        assert len(sizes) >= 90 and max(sizes) <= budget, (input_budget, max(sizes))


def test_merging_alone_stays_bounded_over_a_thousand_steps() -> None:
    steps = _thousand_steps()
    at_500 = _tokens(_merged(_records(steps[:500]), 20))
    at_1000 = _tokens(_merged(_records(steps), 20))
    # Bounded, not linear: doubling the thread adds (almost) nothing once the caps are reached.
    assert at_1000 <= at_500 * 1.1, (at_500, at_1000)


def _warehouse(moves: Sequence[tuple[int, str]], *, noise: int = 3) -> list[LedgerRecord]:
    """A warehouse agent: each move of (item, location) among ``noise`` stock counts."""
    records: list[LedgerRecord] = []

    def add(kind: str, text: str, **payload: Any) -> None:
        seq = len(records) + 1
        records.append(
            LedgerRecord(
                seq,
                f"k{seq}",
                kind,
                {"text": text, **payload},
                text,
                TokenCounts(o200k_base=1, cl100k_base=1),
            )
        )

    def group(call_id: str, name: str, args: dict[str, Any], output: str) -> None:
        add("assistant_message", "", tool_calls=[{"call_id": call_id, "name": name, "args": args}])
        add("tool_outcome", output, call_id=call_id, status="success")

    add("user_input", "Put every item on its shelf. Never move an item twice to the same shelf.")
    for n, (item, location) in enumerate(moves):
        group(
            f"m{n}",
            "move_item",
            {"item_id": item, "location": location},
            f'{{"location": "{location}", "ok": true}}',
        )
        for k in range(noise):
            group(f"c{n}_{k}", "count_stock", {"item_id": item}, "aisle ok " * 10)
    return records


def test_actions_stay_verbatim_when_only_the_skeleton_fits_while_the_steps_around_them_fold() -> None:
    moves = [(42, "shelf_A"), (7, "dock_3"), (19, "shelf_C")]
    summary = _merged(_warehouse(moves, noise=13), 10)
    budget = _tokens(skeleton(summary))
    assert _tokens(summary) > budget  # a real roll-up, not a summary that fits as it is
    fitted = fit_summary(summary, max_tokens=budget, count=COUNT, revision=7)
    text = render_summary(fitted, revision=7)
    for item, location in moves:
        assert f'- move_item {{"item_id":{item},"location":"{location}"}} → ok' in text
    block = text.split("Actions taken", 1)[1].split("\n")[1:]
    listed = block[: next((i for i, line in enumerate(block) if not line.startswith("- ")), len(block))]
    assert len(listed) == len(moves) and not any(
        "count_stock" in line for line in listed
    )  # reads are not actions


def test_the_skeleton_keeps_the_newest_actions_and_counts_the_rest_so_it_stays_bounded_on_a_thousand_step_thread() -> (  # noqa: E501
    None
):
    def moves(n: int) -> list[tuple[int, str]]:
        return [(k, f"shelf_{k % 9}") for k in range(n)]  # distinct items: nothing supersedes anything

    long = _merged(_warehouse(moves(250)), 20)  # 1,000 tool groups
    bare = skeleton(long)
    assert [a.call_id for a in bare.actions] == [f"m{k}" for k in range(250 - SKELETON_ACTIONS, 250)]
    assert bare.actions_folded is not None and bare.actions_folded.steps == 250 - SKELETON_ACTIONS
    assert bare.actions_folded.first == 2  # the first move's call record
    assert (
        f"- records 2–{bare.actions_folded.last}: {250 - SKELETON_ACTIONS} earlier actions — "
        f"move_item ×{250 - SKELETON_ACTIONS}" in render_summary(bare, revision=7)
    )
    short = skeleton(_merged(_warehouse(moves(25)), 20))
    assert _tokens(bare) <= _tokens(short) * 1.1


def test_a_successful_overwrite_of_the_same_target_folds_first_but_separate_bookings_never_do() -> None:
    records = _warehouse([(42, "shelf_A"), (7, "dock_3"), (42, "shelf_C")], noise=0)
    seq = len(records)
    for n in range(2):
        call: dict[str, Any] = {
            "call_id": f"b{n}",
            "name": "book_reservation",
            "args": {"user_id": "mia_li_3668", "flight": f"HAT{n}"},
        }
        records.append(
            LedgerRecord(
                seq + 1,
                f"b{n}",
                "assistant_message",
                {"text": "", "tool_calls": [call]},
                "",
                TokenCounts(o200k_base=1, cl100k_base=1),
            )
        )
        records.append(
            LedgerRecord(
                seq + 2,
                f"o{n}",
                "tool_outcome",
                {"text": "booked", "call_id": f"b{n}", "status": "success"},
                "booked",
                TokenCounts(o200k_base=1, cl100k_base=1),
            )
        )
        seq += 2
    summary = summarize_records(records)
    rolled = fold_actions(summary, keep=None, superseded=True)
    assert [a.call_id for a in rolled.actions] == ["m1", "m2", "b0", "b1"]
    assert rolled.actions_folded is not None and (
        rolled.actions_folded.first,
        rolled.actions_folded.steps,
    ) == (2, 1)
