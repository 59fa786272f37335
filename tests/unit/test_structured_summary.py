"""The deterministic summarizer's progress ledger: what each typed field keeps, and what it drops."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from services.core.compaction.actions import MUTATING_VERBS, READ_VERBS, is_action
from services.core.compaction.merge import (
    fold_actions,
    latest_failures,
    merge_summaries,
    render_summary,
    summary_sources,
)
from services.core.compaction.model import (
    CommandRun,
    FileTouch,
    FileView,
    SourcedText,
    StepFold,
    StructuredSummary,
)
from services.core.compaction.structured import error_line, summarize_records
from services.core.compaction.validate import CandidateInvalid, validate_candidate
from services.core.records import LedgerRecord
from services.core.render import TokenCounts


class _Trace:
    """Ledger records typed in directly: seqs count from 1, outcomes answer the call they name."""

    def __init__(self) -> None:
        self.records: list[LedgerRecord] = []

    def _add(self, kind: str, text: str, **payload: Any) -> int:
        seq = len(self.records) + 1
        self.records.append(
            LedgerRecord(
                seq,
                f"k{seq}",
                kind,
                {"text": text, **payload},
                text,
                TokenCounts(o200k_base=1, cl100k_base=1),
            )
        )
        return seq

    def user(self, text: str) -> int:
        return self._add("user_input", text)

    def call(self, call_id: str, name: str, args: dict[str, Any], text: str = "") -> int:
        return self._add(
            "assistant_message", text, tool_calls=[{"call_id": call_id, "name": name, "args": args}]
        )

    def say(self, text: str) -> int:
        return self._add("assistant_message", text)

    def outcome(self, call_id: str, text: str, status: str = "success") -> int:
        return self._add("tool_outcome", text, call_id=call_id, status=status)

    def run(self, call_id: str, command: str, output: str, status: str = "success", text: str = "") -> int:
        self.call(call_id, "bash", {"command": command}, text)
        return self.outcome(call_id, output, status)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def test_files_modified_say_what_each_edit_changed_from_the_editor_arguments_or_the_shell_command() -> None:
    t = _Trace()
    t.user("Fix src/app.py")
    edit = {
        "command": "str_replace",
        "path": "src/app.py",
        "old_str": "def load(path):\n    return open(path)",
        "new_str": "def load(path):\n    return open(path, 'rb')",
    }
    t.call("e1", "str_replace_editor", edit)
    t.outcome("e1", "The file src/app.py has been edited.")
    t.call(
        "e2",
        "str_replace_editor",
        {"command": "insert", "path": "src/app.py", "insert_line": 12, "new_str": "import io"},
    )
    t.outcome("e2", "ok")
    t.call(
        "e3",
        "str_replace_editor",
        {"command": "create", "path": "tests/test_app.py", "file_text": "a\nb\nc\n"},
    )
    t.outcome("e3", "File created successfully")
    t.run("s1", "sed -i 's/old/new/' src/util.py", "<returncode>0</returncode>\n<output>\n</output>")
    s = summarize_records(t.records)
    changes = {f.path: [c.text for c in f.changes] for f in s.files_modified}
    assert [f.path for f in s.files_modified] == ["src/app.py", "tests/test_app.py", "src/util.py"]
    replace, insert = changes["src/app.py"]
    assert replace.startswith("str_replace in load() 'def load(path): return open(path)'→")
    assert "open(path, \\'rb\\')" in replace
    assert insert == "insert after L12: 'import io'"
    assert changes["tests/test_app.py"] == ["create (3 lines)"]
    assert changes["src/util.py"] == ["`sed -i 's/old/new/' src/util.py`"]
    assert [c.sources for f in s.files_modified for c in f.changes] == [(2,), (4,), (6,), (8,)]


def test_files_read_keep_the_range_shown_and_a_hash_that_recognises_an_unchanged_reread() -> None:
    t = _Trace()
    t.user("Look at src/app.py")
    t.call("v1", "str_replace_editor", {"command": "view", "path": "src/app.py", "view_range": [10, 40]})
    t.outcome("v1", "10 def load():")
    t.run("r1", "sed -n '10,40p' src/app.py", "10 def load():")
    t.run("r2", "sed -n 10,40p src/app.py", "10 def load(path):")
    t.run("r3", "head -n 20 README.md", "# title")
    t.run("r4", "cat setup.cfg", "[metadata]")
    s = summarize_records(t.records)
    views = {f.path: [(v.lines, v.sha, v.sources) for v in f.views] for f in s.files_read}
    assert views["src/app.py"] == [
        (
            "L10-40",
            _sha("10 def load():"),
            (2, 3, 4, 5),
        ),  # the same content read twice: one entry, both reads cited
        ("L10-40", _sha("10 def load(path):"), (6, 7)),
    ]
    assert views["README.md"] == [("L1-20", _sha("# title"), (8, 9))]
    assert views["setup.cfg"] == [("", _sha("[metadata]"), (10, 11))]
    text = render_summary(s, revision=1)
    assert f"- src/app.py: L10-40 #{_sha('10 def load():')} (seq 2,3,4,5)" in text


def test_each_distinct_command_is_listed_once_with_run_count_last_status_and_last_failure() -> None:
    t = _Trace()
    t.user("Make the tests pass")
    t.run(
        "c1",
        "pytest -x tests",
        "E   AssertionError: 1 != 2\nFAILED tests/test_a.py::test_one - AssertionError",
        "error",
    )
    t.run("c2", "ls", "a b")
    t.run("c3", "pytest -x tests", "E   KeyError: 'x'\nFAILED tests/test_a.py::test_two - KeyError", "error")
    s = summarize_records(t.records)
    runs = {c.command: c for c in s.commands}
    assert list(runs) == ["ls", "pytest -x tests"]  # ordered by their last run
    pytest_run = runs["pytest -x tests"]
    assert (pytest_run.runs, pytest_run.status, pytest_run.tool) == (2, "error", "bash")
    assert pytest_run.last_failure == "E KeyError: 'x' | FAILED tests/test_a.py::test_two - KeyError"
    assert pytest_run.sources == (2, 3, 6, 7)
    (latest,) = latest_failures(s)
    assert latest.call_id == "c3" and [f.call_id for f in s.failures] == ["c1", "c3"]


def test_a_later_success_of_the_same_command_clears_its_failures_from_the_latest_failures() -> None:
    t = _Trace()
    t.user("Make the tests pass")
    t.run("c1", "pytest -x tests", "FAILED tests/test_a.py::test_one", "error")
    t.run("c2", "pytest tests/test_b.py", "FAILED tests/test_b.py::test_b", "error")
    t.run("c3", "pytest -x tests", "1 passed")
    s = summarize_records(t.records)
    assert [(f.call_id, f.cleared_at) for f in s.failures] == [("c1", 7), ("c2", None)]
    assert [f.call_id for f in latest_failures(s)] == ["c2"]
    text = render_summary(s, revision=1)
    latest = text.split("Latest failures:\n", 1)[1].splitlines()[0]
    assert (
        "tests/test_b.py::test_b" in latest
        and "test_one" not in text.split("Latest failures:", 1)[1].split("\n", 2)[1]
    )
    assert "`pytest -x tests` ×2 last ok (failed before: FAILED tests/test_a.py::test_one)" in text


def test_a_success_in_a_later_segment_clears_a_failure_of_the_parent_when_merged() -> None:
    t = _Trace()
    t.user("Make the tests pass")
    t.run("c1", "pytest -x tests", "FAILED tests/test_a.py::test_one", "error")
    t.run("c2", "pytest -x tests", "1 passed")
    parent, child = summarize_records(t.records[:3]), summarize_records(t.records[3:])
    merged = merge_summaries(parent, child)
    assert [(f.call_id, f.cleared_at) for f in merged.failures] == [("c1", 5)]
    assert latest_failures(merged) == ()
    assert [(c.command, c.runs, c.status) for c in merged.commands] == [("pytest -x tests", 2, "success")]


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            'Traceback (most recent call last):\n  File "a.py", line 3\nValueError: bad value',
            "ValueError: bad value",
        ),
        (
            "collected 3 items\nFAILED tests/t.py::test_x - assert 1 == 2\n1 failed",
            "FAILED tests/t.py::test_x - assert 1 == 2 | 1 failed",
        ),
        (
            "E   KeyError: 'x'\nsome context\nFAILED tests/t.py::test_y - KeyError: "
            "'x'\n===== 1 failed in 0.12s =====",
            "E KeyError: 'x' | FAILED tests/t.py::test_y - KeyError: 'x' | ===== 1 failed in 0.12s =====",
        ),
        (
            "<returncode>2</returncode>\n<output>\npatching file a.py\npatch: "
            "**** malformed patch at line 3\n</output>",
            "patch: **** malformed patch at line 3 | exit status 2",
        ),
        ("<returncode>1</returncode>\n<output>\n</output>", "(no output) | exit status 1"),
        (
            "django.core.exceptions.ImproperlyConfigured: settings are not configured",
            "django.core.exceptions.ImproperlyConfigured: settings are not configured",
        ),
    ],
)
def test_the_telling_line_of_a_failure_is_its_error_class_failing_test_last_error_line_and_exit_status(
    output: str, expected: str
) -> None:
    assert error_line(output) == expected


def test_a_progress_line_skips_wrapper_lines_and_the_echo_of_its_command() -> None:
    t = _Trace()
    t.user("go")
    t.run("c1", "ls src", "<returncode>0</returncode>\n<output>\napp.py\n</output>")
    t.run("c2", "echo hi", "$ echo hi\nhi")
    s = summarize_records(t.records)
    assert [p.text for p in s.progress] == ["bash(ls src) → success: app.py", "bash(echo hi) → success: hi"]


def test_announcing_a_look_is_not_a_decision_but_a_stated_change_is() -> None:
    t = _Trace()
    t.user("go")
    t.say("Let me check the parser first. I'll look at the tests too. Now let me view the file:")
    t.say(
        "I will replace split() with split(' ') because the renderer drops spaces. The fix is to keep the "
        "separator."
    )
    s = summarize_records(t.records)
    assert [d.text for d in s.decisions] == [
        "I will replace split() with split(' ') because the renderer drops spaces.",
        "The fix is to keep the separator.",
    ]


def test_user_constraints_are_kept_verbatim_as_whole_sentences_never_clipped() -> None:
    long = (
        "You must keep the public API of "
        + ", ".join(f"module_{n}" for n in range(40))
        + " exactly as it is."
    )
    t = _Trace()
    t.user(f"Fix the bug. {long} Do not touch the tests. Thanks!")
    s = summarize_records(t.records)
    assert [c.text for c in s.constraints] == [long, "Do not touch the tests."]
    assert len(long) > 400  # longer than any other item may be


def test_an_edit_followed_by_a_failing_run_and_a_change_of_course_is_a_failed_approach() -> None:
    t = _Trace()
    t.user("Make the tests pass")
    t.call(
        "e1",
        "str_replace_editor",
        {"command": "str_replace", "path": "src/a.py", "old_str": "x = 1", "new_str": "x = 2"},
    )
    t.outcome("e1", "edited")
    t.run("c1", "pytest -x tests", "E   AssertionError: 2 != 3", "error")
    t.say("That didn't work, so I will try another approach: change the caller instead.")
    s = summarize_records(t.records)
    (approach,) = s.approaches_failed
    assert approach.text == (
        "src/a.py: str_replace 'x = 1'→'x = 2' then `pytest -x tests` failed: E AssertionError: 2 != 3"
        " — then: That didn't work, so I will try another approach: change the caller instead."
    )
    assert approach.sources == (2, 4, 5, 6)


def test_the_latest_explanation_the_model_gave_is_the_hypothesis() -> None:
    t = _Trace()
    t.user("Why does it crash?")
    t.say("I think the config is missing.")
    t.run("c1", "cat app.cfg", "[app]")
    t.say("The config is there. The problem is that the parser ignores sections.")
    s = summarize_records(t.records)
    assert s.hypothesis == SourcedText(text="The problem is that the parser ignores sections.", sources=(5,))
    assert "Hypothesis: The problem is that the parser ignores sections. (seq 5)" in render_summary(
        s, revision=1
    )


def test_a_summary_stored_before_the_ledger_fields_existed_still_parses_and_renders() -> None:
    old = {
        "covered_from": 2,
        "covered_to": 9,
        "goal": {"text": "Fix it", "sources": [2]},
        "current_request": None,
        "constraints": [{"text": "Do not touch tests.", "sources": [2]}],
        "decisions": [],
        "progress": [{"text": "bash(ls) → success: a", "sources": [3, 4]}],
        "files_read": [{"path": "a.py", "sources": [5]}],
        "files_modified": [{"path": "b.py", "sources": [7]}],
        "failures": [
            {"call_id": "c3", "name": "bash", "status": "error", "detail": "boom", "sources": [8, 9]}
        ],
        "unresolved": [],
        "next_steps": [{"text": "continue", "sources": [9]}],
        "references": [],
    }
    s = StructuredSummary.model_validate_json(json.dumps(old))
    assert s.commands == () and s.folded is None and s.files_modified[0].changes == ()
    assert s.actions == () and s.actions_folded is None
    assert [f.call_id for f in latest_failures(s)] == ["c3"]
    text = render_summary(s, revision=3)
    assert "- bash c3 error: boom (seq 8,9)" in text and "Files modified: b.py (seq 7)" in text
    with pytest.raises(ValueError):
        StructuredSummary.model_validate({**old, "unknown_field": 1})  # extra fields are still refused


def test_summary_sources_and_validation_reach_every_nested_citation() -> None:
    t = _Trace()
    t.user("go")
    t.run("c1", "ls", "a")
    s = summarize_records(t.records)
    seqs = {r.seq for r in t.records}
    validate_candidate(s, parent=None, covered=t.records, existing_seqs=seqs, has_request=True)
    nested = {
        "change": s.model_copy(
            update={
                "files_modified": (
                    FileTouch(path="x", sources=(2,), changes=(SourcedText(text="c", sources=(40,)),)),
                )
            }
        ),
        "view": s.model_copy(
            update={"files_read": (FileTouch(path="x", sources=(2,), views=(FileView(sources=(41,)),)),)}
        ),
        "command": s.model_copy(
            update={
                "commands": (CommandRun(command="ls", tool="bash", runs=1, status="success", sources=(42,)),)
            }
        ),
        "approach": s.model_copy(update={"approaches_failed": (SourcedText(text="a", sources=(43,)),)}),
        "hypothesis": s.model_copy(update={"hypothesis": SourcedText(text="h", sources=(44,))}),
        "fold": s.model_copy(update={"folded": StepFold(first=1, last=45, steps=3)}),
    }
    for offender, seq in zip(nested.values(), range(40, 46), strict=True):
        assert seq in summary_sources(offender)
        with pytest.raises(CandidateInvalid, match=f"outside the covered range: \\[{seq}\\]"):
            validate_candidate(offender, parent=None, covered=t.records, existing_seqs=seqs, has_request=True)
    never_ran = s.model_copy(
        update={"commands": (CommandRun(command="ls", tool="bash", runs=0, status="success", sources=(2,)),)}
    )
    with pytest.raises(CandidateInvalid, match="ran 0 times"):
        validate_candidate(never_ran, parent=None, covered=t.records, existing_seqs=seqs, has_request=True)


def test_the_ledger_is_deterministic_byte_for_byte() -> None:
    def build() -> str:
        t = _Trace()
        t.user("Fix it. Do not touch tests.")
        t.run("c1", "pytest", "FAILED t.py::a", "error")
        t.call("e1", "edit", {"command": "str_replace", "path": "a.py", "old_str": "a", "new_str": "b"})
        t.outcome("e1", "ok")
        t.run("c2", "pytest", "1 passed")
        return summarize_records(t.records).model_dump_json() + render_summary(
            summarize_records(t.records), revision=1
        )

    assert build() == build()


def test_the_next_step_continues_the_last_stated_intent_not_a_bare_tool_call() -> None:
    t = _Trace()
    t.user("Make the tests pass")
    t.say("The parser is fixed; next I will run the full suite.")
    t.run("c1", "ls", "a")
    s = summarize_records(t.records)
    assert s.next_steps == (
        SourcedText(
            text="continue from the last stated intent: The parser is fixed; next I will run the full suite.",
            sources=(2,),
        ),
    )


def _compact(args: dict[str, Any]) -> str:
    return json.dumps(args, separators=(",", ":"))


def test_state_changing_calls_of_business_tools_are_actions_with_args_verbatim_real_status_and_sources() -> (
    None
):
    t = _Trace()
    t.user("Change my flight on reservation ZFA04Y to the 3pm one, then book one for my mother.")
    t.call("g1", "get_reservation_details", {"reservation_id": "ZFA04Y"})
    t.outcome("g1", '{"reservation_id": "ZFA04Y", "flights": ["HAT170"]}')
    update = {
        "reservation_id": "ZFA04Y",
        "cabin": "economy",
        "flights": [{"flight_number": "HAT045", "date": "2024-05-17"}],
        "payment_id": "credit_card_4421486",
    }
    call_u = t.call("u1", "update_reservation_flights", update)
    out_u = t.outcome("u1", '{"reservation_id": "ZFA04Y", "flights": ["HAT045"]}')
    t.call("th", "think", {"thought": "now the booking"})
    t.outcome("th", "")
    book = {
        "user_id": "mia_li_3668",
        "origin": "JFK",
        "destination": "SEA",
        "passengers": [{"first_name": "Ana", "last_name": "Li"}],
    }
    call_b = t.call("b1", "book_reservation", book)
    out_b = t.outcome("b1", '{"reservation_id": "HATHAT", "status": "booked"}')
    call_c = t.call("x1", "cancel_reservation", {"reservation_id": "Q69X3R"})
    out_c = t.outcome("x1", "Error: reservation Q69X3R cannot be cancelled: basic economy", "error")
    s = summarize_records(t.records)
    assert [(a.tool, a.args, a.status, a.call_id, a.target, a.sources) for a in s.actions] == [
        (
            "update_reservation_flights",
            _compact(update),
            "success",
            "u1",
            "reservation_id=ZFA04Y",
            (call_u, out_u),
        ),
        ("book_reservation", _compact(book), "success", "b1", "user_id=mia_li_3668", (call_b, out_b)),
        (
            "cancel_reservation",
            _compact({"reservation_id": "Q69X3R"}),
            "error",
            "x1",
            "reservation_id=Q69X3R",
            (call_c, out_c),
        ),
    ]
    assert "HATHAT" in s.actions[1].result and "basic economy" in s.actions[2].result
    text = render_summary(s, revision=1)
    assert "Actions taken (side effects already done, oldest first):" in text
    assert f"- book_reservation {_compact(book)} → ok: {s.actions[1].result} (seq {call_b},{out_b})" in text
    assert f"- cancel_reservation {_compact({'reservation_id': 'Q69X3R'})} → error: " in text
    assert {call_u, out_u, call_b, out_b, call_c, out_c} <= set(summary_sources(s))
    validate_candidate(
        s, parent=None, covered=t.records, existing_seqs={r.seq for r in t.records}, has_request=True
    )


def test_a_warehouse_move_is_an_action_and_counting_stock_around_it_is_not() -> None:
    t = _Trace()
    t.user("Where is item 42 now?")
    move = t.call("m1", "move_item", {"item_id": 42, "location": "shelf_A"})
    moved = t.outcome("m1", '{"location": "shelf_A", "ok": true}')
    for n in range(12):
        t.call(f"c{n}", "count_stock", {"item_id": 42})
        t.outcome(f"c{n}", "aisle ok")
    s = summarize_records(t.records)
    assert [(a.tool, a.args, a.sources) for a in s.actions] == [
        ("move_item", '{"item_id":42,"location":"shelf_A"}', (move, moved))
    ]
    assert '- move_item {"item_id":42,"location":"shelf_A"} → ok' in render_summary(s, revision=1)


@pytest.mark.parametrize(
    "name",
    [
        "update_reservation_flights",
        "cancel_reservation",
        "book_reservation",
        "send_certificate",
        "transfer_to_human_agents",
        "move_item",
        "mcp__crm__updateContact",
        "shop.place_order",
        "open_ticket",
        "modify_pending_order_address",
        "refund-payment",
    ],
)
def test_a_mutating_verb_makes_a_business_tool_call_an_action(name: str) -> None:
    assert is_action(name, {"item_id": 1})


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("get_user_details", {"user_id": "u"}),
        ("list_all_airports", {}),
        ("search_direct_flight", {"origin": "JFK"}),
        ("find_item", {}),
        ("view_order", {}),
        ("count_stock", {"item_id": 42}),
        ("check_availability", {}),
        ("calculate", {"expression": "2+2"}),
        ("think", {"thought": "x"}),
        ("lookup_customer", {}),
        ("fetch_invoice", {}),
        ("describe_table", {}),
        ("show_status", {}),
        ("query_db", {}),
        ("mcp__crm__getContact", {}),
        ("open_file", {}),
        ("frobnicate_widget", {}),  # a verb on neither list is not guessed at
        ("bash", {"command": "mv a.txt b.txt"}),
        ("write_file", {"path": "a.py", "content": "x"}),
        ("create", {"path": "notes.md"}),
        ("edit", {"path": "a.py"}),
        ("apply_patch", {"input": "*** Begin Patch"}),
        ("delete_file", {"path": "a.py"}),
    ],
)
def test_reads_file_tools_shell_and_unknown_verbs_are_not_actions(name: str, args: dict[str, Any]) -> None:
    assert not is_action(name, args)


def test_no_verb_is_both_a_read_and_a_mutation() -> None:
    assert not MUTATING_VERBS & READ_VERBS


def test_an_action_whose_outcome_is_not_recorded_is_kept_with_unknown_status() -> None:
    t = _Trace()
    t.user("Cancel reservation Q69X3R.")
    call = t.call("x1", "cancel_reservation", {"reservation_id": "Q69X3R"})
    s = summarize_records(t.records)
    assert [(a.call_id, a.status, a.sources) for a in s.actions] == [("x1", "unknown", (call,))]


def test_validation_refuses_a_summary_that_forgets_an_action_unless_it_is_in_the_folded_range() -> None:
    t = _Trace()
    t.user("Move item 42 to shelf_A.")
    t.call("m1", "move_item", {"item_id": 42, "location": "shelf_A"})
    t.outcome("m1", "ok")
    s = summarize_records(t.records)
    seqs = {r.seq for r in t.records}
    with pytest.raises(CandidateInvalid, match="actions missing"):
        validate_candidate(
            s.model_copy(update={"actions": ()}),
            parent=None,
            covered=t.records,
            existing_seqs=seqs,
            has_request=True,
        )
    folded = fold_actions(s, keep=0)
    assert folded.actions == () and folded.actions_folded is not None and folded.actions_folded.steps == 1
    validate_candidate(folded, parent=None, covered=t.records, existing_seqs=seqs, has_request=True)
    outside = folded.model_copy(
        update={"actions_folded": folded.actions_folded.model_copy(update={"last": 99})}
    )
    with pytest.raises(CandidateInvalid, match="outside the covered range"):
        validate_candidate(outside, parent=None, covered=t.records, existing_seqs=seqs, has_request=True)


def test_a_summary_beside_the_run_task_points_to_it_instead_of_quoting_it_again() -> None:
    summary = StructuredSummary(
        covered_from=2,
        covered_to=9,
        goal=SourcedText(text="Fix parser.py. Never touch setup.py.", sources=(2,)),
        constraints=(
            SourcedText(text="Never touch setup.py.", sources=(2,)),
            SourcedText(text="Only use pytest -x.", sources=(5,)),
        ),
        next_steps=(SourcedText(text="run the tests", sources=(9,)),),
    )
    alone = render_summary(summary, revision=1)
    beside = render_summary(summary, revision=1, pinned=(2,))
    assert "Fix parser.py" in alone and "Never touch setup.py." in alone
    assert "Goal: record 2, shown in full outside this summary" in beside
    assert "Never touch setup.py." not in beside and "Only use pytest -x." in beside
