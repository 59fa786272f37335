"""Assembly under budget pressure: what the model always sees, the reduction order, and
counting everything that is sent."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import PreparedContext, PrepareRequest, UserInputEvent, UserInputPayload
from services.core.assemble import OverBudgetView, SummaryView, ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from contracts.exceptions import ContextBudgetExceeded
from services.core.groups import build_view_blocks
from services.core.records import LedgerRecord
from services.core.render import telling_line, trim_tool_text
from services.core.request_tokens import count_prepared
from services.core.tokens import counter_for
from tests.fixtures.builders import Thread, ledger_records

COUNTER = counter_for("o200k_base")
# The assembler adds per-entry framing to each tool schema counted on its own; the independent
# count tokenizes the whole array at once. That (≤ 2 per tool, +1) is the only slack allowed.
_SLACK_PER_TOOL = 2


def _snapshot(t: Thread, records: list[LedgerRecord], **fields: Any) -> ThreadSnapshot:
    return ThreadSnapshot(
        t.session_id,
        t.run_id,
        t.instance_id,
        len(records),
        records[-1].seq,
        records[-1].event_key,
        records,
        **fields,
    )


def _request(t: Thread, budget: int, **fields: object) -> PrepareRequest:
    return PrepareRequest.model_validate(
        {
            "session_id": t.session_id,
            "run_id": t.run_id,
            "instance_id": t.instance_id,
            "budget_tokens": budget,
            **fields,
        }
    )


def _prepare(
    t: Thread,
    records: list[LedgerRecord],
    budget: int = 100_000,
    *,
    snapshot: dict[str, Any] | None = None,
    allow_drop_history: bool = False,
    **request: object,
) -> PreparedContext:
    prepared = _assembled(
        t, records, budget, snapshot=snapshot, allow_drop_history=allow_drop_history, **request
    )
    assert isinstance(prepared, PreparedContext)
    return prepared


def _assembled(
    t: Thread,
    records: list[LedgerRecord],
    budget: int = 100_000,
    *,
    snapshot: dict[str, Any] | None = None,
    allow_drop_history: bool = False,
    **request: object,
) -> PreparedContext | OverBudgetView:
    req = _request(t, budget, **request)
    return assemble_context(
        _snapshot(t, records, **(snapshot or {})),
        req,
        resolve_budget(req),
        COUNTER,
        allow_drop_history=allow_drop_history,
    )


def _supplement(t: Thread, text: str) -> UserInputEvent:
    return UserInputEvent(payload=UserInputPayload(text=text, intent="supplement"), **t._env(None))


def _summary(
    records: list[LedgerRecord], covered_to: int, text: str, skeleton: str | None = None
) -> SummaryView:
    return SummaryView(
        summary_id="sum-1",
        view_revision=1,
        covered_from=1,
        covered_to=covered_to,
        text=text,
        tokens_o200k=COUNTER.count(text),
        tokens_cl100k=counter_for("cl100k_base").count(text),
        sources=tuple(r.seq for r in records if r.seq <= covered_to),
        skeleton_text=skeleton,
        skeleton_o200k=COUNTER.count(skeleton or ""),
        skeleton_cl100k=counter_for("cl100k_base").count(skeleton or ""),
    )


def _sizes(err: ContextBudgetExceeded) -> dict[str, int]:
    items: list[dict[str, Any]] = err.details["items"]  # type: ignore[assignment]
    return {str(i["block_id"]): int(i["tokens"]) for i in items}


def _contents(prepared: PreparedContext) -> list[str]:
    return [m.content or "" for m in prepared.messages]


def _coding_thread(t: Thread, groups: int, *, output: str = "line {n} of the log\n" * 120) -> list[Any]:
    events: list[Any] = [t.system("You are careful."), t.user("Fix the failing test in app.py")]
    for n in range(groups):
        events += [
            t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat log{n}.txt"}),)),
            t.outcome(f"c{n}", output.format(n=n)),
        ]
    return events


# --- the run's task ---------------------------------------------------------------------------


def test_run_task_stays_verbatim_after_later_user_inputs_right_after_instructions() -> None:
    t = Thread()
    events = [t.system("Sys."), t.user("Rename foo to bar in lib.py"), t.assistant("ok")]
    events += [
        _supplement(t, "also keep the old name as an alias"),
        t.assistant("noted"),
        t.user("and add a test"),
    ]
    prepared = _prepare(t, ledger_records(events))
    assert [b.block_id for b in prepared.blocks[:2]] == ["instruction:1", "task:2"]
    assert prepared.messages[1].content == "Rename foo to bar in lib.py"
    current = next(b for b in prepared.blocks if b.block_id == "task:6")
    assert (
        not current.droppable and current.first_message == len(prepared.messages) - 1
    )  # in its ledger place


def test_run_task_survives_a_summary_that_covers_it_and_precedes_the_summary() -> None:
    t = Thread()
    events = _coding_thread(t, 3) + [_supplement(t, "use pytest -x"), t.assistant("running")]
    records = ledger_records(events)
    covered_to = 6
    blocks = build_view_blocks(records, covered_to)
    assert "task:2" in {b.block_id for b in blocks.ready}  # coverage never swallows the run's task
    summary = _summary(records, covered_to, "[summary] read logs 0 and 1")
    prepared = _prepare(
        t, records, snapshot={"covered_to": covered_to, "summary": summary, "view_revision": 1}
    )
    assert [b.block_id for b in prepared.blocks[:3]] == ["instruction:1", "task:2", "summary:1"]
    assert prepared.messages[1].content == "Fix the failing test in app.py"


def test_a_supplement_is_never_taken_for_the_run_task() -> None:
    t = Thread()
    records = ledger_records([t.system("Sys."), _supplement(t, "context only"), t.user("the real question")])
    prepared = _prepare(t, records)
    # What came before the run's task stays before it (chronology); the task is the question.
    assert [b.block_id for b in prepared.blocks] == ["instruction:1", "turn:2", "task:3"]
    assert prepared.blocks[2].retention.value == "required" and prepared.blocks[1].droppable


# --- dedup ----------------------------------------------------------------------------------


def test_identical_tool_output_is_shown_once_and_later_as_a_reference() -> None:
    t = Thread()
    same = "FAILED tests/test_app.py::test_x - AssertionError\n" * 30
    events = [t.system("Sys."), t.user("fix it")]
    events += [t.assistant(calls=(("a", "bash", {"cmd": "pytest"}),)), t.outcome("a", same, status="error")]
    events += [t.assistant(calls=(("b", "bash", {"cmd": "pytest"}),)), t.outcome("b", same, status="error")]
    events += [
        t.assistant(calls=(("c", "bash", {"cmd": "pytest"}),)),
        t.outcome("c", same),
    ]  # same text, other status
    prepared = _prepare(t, ledger_records(events))
    tools = [m.content or "" for m in prepared.messages if m.role == "tool"]
    assert tools[0].endswith(same)
    assert tools[1] == "[tool status: error]\n[identical to the output at seq 4]"
    assert tools[2] == same
    assert prepared.budget_report.reductions.deduplicated == 1
    assert prepared.budget_report.reductions.tokens_saved > 0
    assert "deduplicated:group:5@6" in prepared.reductions


def test_a_short_identical_output_is_shown_again_not_as_a_reference() -> None:
    t = Thread()
    events = [t.system("Sys."), t.user("go")]
    events += [
        t.assistant(calls=(("a", "bash", {"cmd": "touch x"}),)),
        t.outcome("a", "<returncode>0</returncode>"),
    ]
    events += [
        t.assistant(calls=(("b", "bash", {"cmd": "touch y"}),)),
        t.outcome("b", "<returncode>0</returncode>"),
    ]
    prepared = _prepare(t, ledger_records(events))
    assert [m.content for m in prepared.messages if m.role == "tool"] == ["<returncode>0</returncode>"] * 2
    assert prepared.budget_report.reductions.deduplicated == 0


def test_a_users_repeated_constraint_is_never_deduplicated() -> None:
    t = Thread()
    rule = "Never touch the migrations folder. " * 10
    events = [t.system("Sys."), t.user(rule), t.assistant("ok"), t.user(rule), t.assistant("ok")]
    prepared = _prepare(t, ledger_records(events))
    assert _contents(prepared).count(rule) == 2
    assert prepared.budget_report.reductions.deduplicated == 0


# --- the newest group -----------------------------------------------------------------------


def test_newest_group_is_always_shown_cut_to_head_and_tail_with_its_read_back_reference() -> None:
    t = Thread()
    big = "".join(f"row {i}: value {i * 7}\n" for i in range(600)) + "ERROR: disk full"
    events = [t.system("Sys. " * 200), t.user("load the data")]
    events += [t.assistant(calls=(("a", "bash", {"cmd": "load"}),)), t.outcome("a", big, status="error")]
    records = ledger_records(events)
    full = _prepare(t, records)
    budget = full.budget_report.used.total - 1500
    prepared = _prepare(t, records, budget=budget)
    tool = prepared.messages[-1]
    assert tool.role == "tool" and tool.tool_call_id == "a"
    content = tool.content or ""
    assert content.startswith("[tool status: error]\nrow 0: value 0") and content.endswith("ERROR: disk full")
    assert "omitted to fit the context; read it back from ctx://blob/" in content
    assert prepared.budget_report.reductions.trimmed == 1 and "trimmed:group:3" in prepared.reductions
    assert prepared.budget_report.used.total <= budget
    assert (
        prepared.budget_report.reductions.tokens_saved
        == full.budget_report.used.total - prepared.budget_report.used.total
    )
    assert count_prepared(prepared, COUNTER) <= prepared.budget_report.used.total


def test_newest_group_without_a_blob_says_it_can_be_reread_as_evidence() -> None:
    t = Thread()
    text = "word " * 700  # under the recorder's limits: no blob, no preview
    events = [t.system("Sys."), t.user("go"), t.assistant(calls=(("a", "bash", {}),)), t.outcome("a", text)]
    records = ledger_records(events, mask_min_chars=10_000, blob_min_bytes=1 << 20)
    records = [replace(r, thread_id=t.thread_id, thread_seq=r.seq) for r in records]
    full = _prepare(t, records, snapshot={"own_thread": t.thread_id})
    prepared = _prepare(
        t, records, budget=full.budget_report.used.total - 300, snapshot={"own_thread": t.thread_id}
    )
    content = prepared.messages[-1].content or ""
    assert f"omitted to fit the context; re-read it as evidence: thread {t.thread_id}, seq 4 …]" in content
    assert content.startswith("word word") and content.endswith("word ")


def test_a_cut_failed_output_keeps_its_telling_line_from_the_middle() -> None:
    t = Thread()
    text = "setup step\n" * 500 + "AssertionError: expected 3, got 4\n" + "teardown step\n" * 500
    events = [
        t.system("Sys."),
        t.user("go"),
        t.assistant(calls=(("a", "bash", {"cmd": "pytest"}),)),
        t.outcome("a", text, status="error"),
    ]
    records = ledger_records(events, tool_result_max_tokens=10_000)
    full = _prepare(t, records)
    budget = full.budget_report.used.total - 1000
    prepared = _prepare(t, records, budget=budget)
    content = prepared.messages[-1].content or ""
    assert (
        content.count("AssertionError") == 1
        and content.endswith("\n[telling line: AssertionError: expected 3, got 4]")
        and "omitted to fit the context" in content
    )
    assert prepared.budget_report.used.total <= budget


def test_recording_trim_can_keep_a_telling_line_from_the_middle() -> None:
    text = "setup step\n" * 500 + "AssertionError: expected 3, got 4\n" + "teardown step\n" * 500
    line = telling_line(text)
    assert line == "AssertionError: expected 3, got 4"
    plain = trim_tool_text(text, COUNTER, max_tokens=200, blob_ref="ctx://blob/x")
    kept = trim_tool_text(text, COUNTER, max_tokens=200, blob_ref="ctx://blob/x", keep=line)
    assert plain is not None and kept is not None and line not in plain[0]
    assert "\n[telling line: AssertionError: expected 3, got 4]\n" in kept[0] and kept[1] == plain[1]
    assert COUNTER.count(kept[0]) <= COUNTER.count(plain[0]) + 2  # the line takes the place of head and tail
    assert telling_line(kept[0]) == line  # found again in the cut text, not wrapped twice
    # A line the cut keeps anyway is not repeated.
    assert trim_tool_text(text, COUNTER, max_tokens=200, blob_ref="ctx://blob/x", keep="setup step") == plain


def test_old_groups_are_masked_but_the_newest_ones_keep_their_output_and_history_waits_for_compaction() -> (
    None
):
    t = Thread()
    records = ledger_records(_coding_thread(t, 6))
    full = _prepare(t, records)
    prepared = _prepare(t, records, budget=full.budget_report.used.total * 2 // 3)
    masked = [
        "output masked to save context" in (m.content or "") for m in prepared.messages if m.role == "tool"
    ]
    assert masked[0] and masked == sorted(masked, reverse=True)  # the oldest first, a prefix
    assert masked[-2:] == [False, False]  # the newest groups keep their full output
    assert prepared.budget_report.reductions.masked == sum(masked)
    assert isinstance(_assembled(t, records, budget=full.budget_report.used.total // 3), OverBudgetView)


def test_a_masked_failed_output_keeps_its_telling_line() -> None:
    t = Thread()
    failing = "collecting...\n" + "test_a PASSED\n" * 80 + "ValueError: bad config key 'port'\nexit status 1"
    events = [
        t.system("Sys."),
        t.user("fix it"),
        t.assistant(calls=(("f", "bash", {"cmd": "pytest"}),)),
        t.outcome("f", failing, status="error"),
    ]
    events += _coding_thread(t, 3)[2:]
    records = ledger_records(events)
    full = _prepare(t, records)
    prepared = _prepare(t, records, budget=full.budget_report.used.total - 100)
    failed = next(m.content or "" for m in prepared.messages if m.tool_call_id == "f")
    assert "output masked to save context" in failed
    assert "[telling line: ValueError: bad config key 'port']" in failed


@pytest.mark.parametrize(
    ("command", "kept"), [("python app.py 2>&1 | head -200", True), ("cat app.log", False)]
)
def test_a_masked_output_keeps_its_telling_line_when_only_the_output_shows_the_failure(
    command: str, kept: bool
) -> None:
    t = Thread()
    # Exit status 0 (the pipe's); the traceback that ends it is the failure unless it is a file shown.
    traceback = "Traceback (most recent call last):\n" + '  File "app.py", line 9, in <module>\n' * 80
    events = [
        t.system("Sys."),
        t.user("fix it"),
        t.assistant(calls=(("f", "bash", {"cmd": command}),)),
        t.outcome("f", traceback + "ValueError: bad config key 'port'"),
    ]
    events += _coding_thread(t, 3)[2:]
    records = ledger_records(events)
    full = _prepare(t, records)
    prepared = _prepare(t, records, budget=full.budget_report.used.total - 100)
    shown = next(m.content or "" for m in prepared.messages if m.tool_call_id == "f")
    assert "output masked to save context" in shown
    assert ("[telling line: ValueError: bad config key 'port']" in shown) is kept


def test_masking_in_chunks_keeps_consecutive_contexts_extending_each_other() -> None:
    t = Thread()
    events = _coding_thread(t, 50, output="line {n} of the log\n" * 60)
    previous: PreparedContext | None = None
    masked_before: set[str] = set()
    extended = steps = 0
    for n in range(5, 50):
        prepared = _prepare(t, ledger_records(events[: 2 + 2 * n]), budget=16_000)
        masked = {b.block_id for b in prepared.blocks if "masked" in b.reason}
        assert masked_before <= masked  # between compactions an output once masked stays masked
        if previous is not None:
            steps += 1
            extended += prepared.messages[: len(previous.messages)] == previous.messages
        previous, masked_before = prepared, masked
    assert masked_before  # the thread did outgrow the budget
    assert extended / steps >= 0.9


# --- summary skeleton and required content --------------------------------------------------


def test_summary_falls_back_to_its_skeleton_before_the_newest_group_is_cut() -> None:
    t = Thread()
    events = _coding_thread(t, 2)  # the summary covers the first group; the second is the newest
    records = ledger_records(events)
    summary = _summary(
        records,
        4,
        "[summary] " + "progress line. " * 400,
        skeleton="[summary skeleton] task, files, next step",
    )
    snap = {"covered_to": 4, "summary": summary, "view_revision": 1}
    full = _prepare(t, records, snapshot=snap)
    prepared = _prepare(t, records, budget=full.budget_report.used.total - 600, snapshot=snap)
    assert "[summary skeleton] task, files, next step" in _contents(prepared)
    block = next(b for b in prepared.blocks if b.kind.value == "summary")
    assert "skeleton" in block.reason
    assert prepared.budget_report.reductions.summary_skeleton == 1
    assert prepared.budget_report.reductions.trimmed == 0  # the newest group kept its whole output


def test_budget_exceeded_only_when_required_content_at_its_smallest_does_not_fit() -> None:
    t = Thread()
    events = [
        t.system("rules " * 300),
        t.user("question " * 50),
        t.assistant(calls=(("a", "bash", {}),)),
        t.outcome("a", "x " * 3000),
    ]
    records = ledger_records(events)
    tools = [{"name": "bash", "description": "run a command", "parameters": {"type": "object"}}]
    with pytest.raises(ContextBudgetExceeded) as err:
        _prepare(t, records, budget=300, tools=tools)
    items = _sizes(err.value)
    assert set(items) == {"instruction:1", "task:2", "group:3", "tool_schemas", "reply_priming"}
    smallest = sum(items.values())
    assert err.value.details["required"] == smallest
    prepared = _prepare(t, records, budget=smallest, tools=tools)  # exactly the smallest fits
    assert prepared.messages[-1].role == "tool" and prepared.budget_report.used.total <= smallest


# --- dropping history once compaction did not land ------------------------------------------


def test_allow_drop_history_drops_the_oldest_history_and_reports_it_instead_of_over_budget() -> None:
    t = Thread()
    records = ledger_records(_coding_thread(t, 8))
    full = _prepare(t, records)
    budget = full.budget_report.used.total // 4
    assert isinstance(_assembled(t, records, budget=budget), OverBudgetView)
    prepared = _prepare(t, records, budget=budget, allow_drop_history=True)
    assert prepared.budget_report.used.total <= budget
    dropped = [o for o in prepared.omitted if o.reason.startswith("history awaiting compaction")]
    assert dropped and [o.block_id for o in dropped] == sorted(
        (o.block_id for o in dropped), key=lambda b: int(b.split(":")[1])
    )
    assert dropped[0].block_id == "group:3"  # oldest first
    assert prepared.budget_report.reductions.dropped_history == len(dropped)
    shown = {b.block_id for b in prepared.blocks}
    assert {"instruction:1", "task:2", "group:17"} <= shown  # required blocks and the newest group stay
    assert prepared.messages[-1].tool_call_id == "c7"
    again = _prepare(t, list(records), budget=budget, allow_drop_history=True)
    assert again.model_dump_json() == prepared.model_dump_json()  # deterministic, id included


@pytest.mark.parametrize("encoding", ["o200k_base", "estimate"])
def test_with_history_dropping_every_budget_where_required_content_fits_gets_a_context(encoding: str) -> None:
    t = Thread()
    events = _coding_thread(t, 6, output='line {n}\t"quoted"\n' * 300)
    events += [_supplement(t, "keep the API"), t.assistant(calls=(("z", "bash", {"cmd": "pytest"}),))]
    events += [t.outcome("z", "FAILED test_api - KeyError: 'x'\n" * 80, status="error")]
    records = ledger_records(events)
    outcomes = {"fits": 0, "required_too_big": 0}
    for budget in range(40, 9000, 97):
        req = PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            profile={"name": "m", "context_window": budget, "encoding": encoding},  # type: ignore[arg-type]
        )
        counter = counter_for("o200k_base") if encoding == "o200k_base" else None
        try:
            prepared = assemble_context(
                _snapshot(t, records), req, resolve_budget(req), counter, allow_drop_history=True
            )
        except ContextBudgetExceeded as err:
            assert sum(_sizes(err).values()) > budget
            outcomes["required_too_big"] += 1
            continue
        if isinstance(prepared, OverBudgetView):
            assert sum(_sizes(prepared.error()).values()) > budget
            outcomes["required_too_big"] += 1
            continue
        assert prepared.budget_report.used.total <= budget
        assert prepared.messages[-1].tool_call_id == "z"  # the result of the last action is always there
        assert prepared.messages[1].content == "Fix the failing test in app.py"
        outcomes["fits"] += 1
    assert outcomes["fits"] > 80 and outcomes["required_too_big"] >= 1


def test_a_reference_never_points_at_a_dropped_output() -> None:
    t = Thread()
    same = "the same long output line\n" * 200
    events = [t.system("Sys."), t.user("go")]
    events += [t.assistant(calls=(("a", "bash", {"cmd": "x"}),)), t.outcome("a", same)]
    events += [t.assistant(calls=(("m", "bash", {"cmd": "y"}),)), t.outcome("m", "other " * 2000)]
    events += [t.assistant(calls=(("b", "bash", {"cmd": "x"}),)), t.outcome("b", same)]
    records = ledger_records(events)
    full = _prepare(t, records)
    assert full.budget_report.reductions.deduplicated == 1
    prepared = _prepare(t, records, budget=full.budget_report.used.total // 2, allow_drop_history=True)
    assert "group:3" in {o.block_id for o in prepared.omitted}
    assert "identical to the output" not in (prepared.messages[-1].content or "")


def test_dropped_history_leaves_a_note_with_its_files_and_the_failures_no_later_call_redid() -> None:
    t = Thread()
    failing = "running\n" * 200 + "FAILED tests/test_a.py::test_a - KeyError: 'port'"
    events = [t.system("Sys."), t.user("go")]
    events += [
        t.assistant(calls=(("f", "bash", {"cmd": "pytest"}),)),
        t.outcome("f", failing, status="error"),
    ]
    events += [
        t.assistant(calls=(("g", "bash", {"cmd": "make"}),)),
        t.outcome("g", "make: *** [all] Error 2\n" * 100, status="error"),
    ]
    events += [t.assistant(calls=(("h", "bash", {"cmd": "make"}),)), t.outcome("h", "built ok\n" * 100)]
    events += [
        t.assistant(calls=(("r", "bash", {"cmd": "cat src/app.py"}),)),
        t.outcome("r", "import os\n" * 100),
    ]
    events += [t.assistant(calls=(("n", "bash", {"cmd": "ls"}),)), t.outcome("n", "file\n" * 400)]
    records = ledger_records(events)
    full = _prepare(t, records)
    prepared = _prepare(t, records, budget=full.budget_report.used.total // 3, allow_drop_history=True)
    gap = next(b for b in prepared.blocks if b.block_id.startswith("history-gap:"))
    note = prepared.messages[gap.first_message].content or ""
    assert note.startswith("[history awaiting compaction:")
    assert (
        """- last bash {"cmd":"pytest"} failed (seq 4, error): """
        "FAILED tests/test_a.py::test_a - KeyError: 'port'" in note
    )
    assert 'last bash {"cmd":"make"}' not in note  # a later make succeeded: that failure is over
    assert "\n- files read there: src/app.py\n" in note
    assert prepared.budget_report.used.total <= full.budget_report.used.total // 3


# --- counting everything that is sent ---------------------------------------------------------


def test_reported_total_covers_every_call_id_and_tool_message_id() -> None:
    t = Thread()
    long_id = "call_" + "Zq9x" * 10
    events = [
        t.system("Sys."),
        t.user("go"),
        t.assistant(calls=((long_id, "bash", {"cmd": "ls"}),)),
        t.outcome(long_id, "a b"),
    ]
    tools = [
        {
            "name": "bash",
            "description": "run",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        }
    ]
    prepared = _prepare(t, ledger_records(events), tools=tools)
    independent = count_prepared(prepared, COUNTER)
    assert independent <= prepared.budget_report.used.total <= independent + _SLACK_PER_TOOL * len(tools) + 1


def test_a_call_id_containing_an_at_sign_still_closes_its_group() -> None:
    t = Thread()
    events = [
        t.system("Sys."),
        t.user("go"),
        t.assistant(calls=(("fn@1", "bash", {}),)),
        t.outcome("fn@1", "done"),
    ]
    records = [
        replace(r, thread_id="r-parent.main" if r.seq > 2 else t.thread_id) for r in ledger_records(events)
    ]
    own = _prepare(t, ledger_records(events))
    assert [m.tool_call_id for m in own.messages if m.role == "tool"] == ["fn@1"] and own.pending_calls == ()
    inherited = _prepare(t, records, snapshot={"own_thread": t.thread_id})
    call, result = inherited.messages[-2:]
    assert call.tool_calls is not None and call.tool_calls[0].id.startswith("fn@1@")  # tagged with its thread
    assert result.tool_call_id == call.tool_calls[0].id and inherited.pending_calls == ()


def test_inherited_calls_are_counted_with_their_tagged_ids() -> None:
    t = Thread()
    events = [
        t.system("Sys."),
        t.user("go"),
        t.assistant(calls=(("c1", "bash", {"cmd": "ls"}),)),
        t.outcome("c1", "out"),
    ]
    records = [
        replace(r, thread_id="r-parent.main" if r.seq in (3, 4) else t.thread_id, thread_seq=r.seq)
        for r in ledger_records(events)
    ]
    prepared = _prepare(t, records, snapshot={"own_thread": t.thread_id})
    assert prepared.messages[-1].tool_call_id.startswith("c1@")  # type: ignore[union-attr]
    independent = count_prepared(prepared, COUNTER)
    assert independent <= prepared.budget_report.used.total <= independent + 1


# Any text the recorder accepts (it refuses NUL, which PostgreSQL text cannot store).
_chars = st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00")
_ids = st.one_of(
    st.text(alphabet=_chars, min_size=1, max_size=40), st.text(alphabet="ab@", min_size=1, max_size=6)
)
_text = st.text(alphabet=_chars, max_size=400)
_args = st.dictionaries(
    st.text(alphabet=_chars, min_size=1, max_size=10),
    st.one_of(
        st.integers(-(2**63), 2**63 - 1), st.text(alphabet=_chars, max_size=30), st.booleans(), st.none()
    ),
    max_size=4,
)
# A group: its calls (id, tool name, arguments) and, per call, an output text, how many times it
# repeats (long outputs get previews and are cut) and whether it failed.
_output = st.tuples(_text, st.integers(1, 60), st.booleans())
_group = st.tuples(
    st.lists(
        st.tuples(_ids, st.text(alphabet=_chars, min_size=1, max_size=12), _args),
        min_size=1,
        max_size=3,
        unique_by=lambda c: c[0],
    ),
    st.lists(_output, min_size=3, max_size=3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=st.lists(_group, min_size=1, max_size=6),
    budget_share=st.floats(min_value=0.05, max_value=1.0),
    ntools=st.integers(0, 3),
    inherited=st.integers(0, 3),
)
def test_reported_total_is_at_least_the_independent_count_and_close_to_it(
    groups: list[tuple[list[tuple[str, str, dict[str, Any]]], list[tuple[str, int, bool]]]],
    budget_share: float,
    ntools: int,
    inherited: int,
) -> None:
    t = Thread()
    events: list[Any] = [t.system("Sys."), t.user("go")]
    for g, (calls, outputs) in enumerate(groups):
        ids = [f"{cid}-{g}" for cid, _, _ in calls]
        events.append(
            t.assistant(calls=tuple((i, name, args) for i, (_, name, args) in zip(ids, calls, strict=True)))
        )
        for k, i in enumerate(ids):
            text, times, failed = outputs[k]
            events.append(t.outcome(i, text * times, status="error" if failed else "success"))
    # The first ``inherited`` groups come from a parent thread: their call ids are sent tagged.
    first_own = 3 + sum(1 + len(calls) for calls, _ in groups[:inherited])
    records = [
        replace(r, thread_id="r-parent.main" if 3 <= r.seq < first_own else t.thread_id, thread_seq=r.seq)
        for r in ledger_records(events)
    ]
    snap = {"own_thread": t.thread_id}
    tools = [
        {"name": f"tool{i}", "description": "does things " * i, "parameters": {"type": "object", "x": [i]}}
        for i in range(ntools)
    ]
    full = _prepare(t, records, tools=tools, snapshot=snap)
    budget = max(1, int(full.budget_report.used.total * budget_share))
    attempts = [full]
    try:
        dropped = _assembled(t, records, budget=budget, tools=tools, allow_drop_history=True, snapshot=snap)
        if isinstance(dropped, OverBudgetView):
            raise dropped.error()  # what the prepare answers then
        attempts.append(dropped)
        fitted = _assembled(t, records, budget=budget, tools=tools, snapshot=snap)
        if isinstance(fitted, PreparedContext):  # else compaction must catch up first
            attempts.append(fitted)
    except ContextBudgetExceeded as err:  # only when required content at its smallest does not fit
        assert sum(_sizes(err).values()) > budget
    for prepared in attempts:
        independent = count_prepared(prepared, COUNTER)
        assert independent <= prepared.budget_report.used.total <= independent + _SLACK_PER_TOOL * ntools + 1
        assert prepared.budget_report.used.total <= prepared.budget_report.input_budget
        assert json.loads(prepared.model_dump_json())  # serializable as sent


def test_a_newest_call_with_a_huge_argument_is_cut_to_fit_and_stays_valid_json() -> None:
    t = Thread()
    script = "".join(f"def step_{n}(x):\n    return x + {n}\n\n" for n in range(400))  # ~6k tokens of heredoc
    events = [
        t.system("Rules. " * 200),
        t.user("Write the steps module", key="task"),
        t.assistant(
            "Writing it.", calls=(("w1", "bash", {"command": f"cat > steps.py << 'EOF'\n{script}EOF"}),)
        ),
        t.outcome("w1", "(no output)"),
    ]
    records = ledger_records(events)
    prepared = _prepare(t, records, 2_000)
    assert prepared.budget_report.used.total <= 2_000
    call = next(m for m in prepared.messages if m.tool_calls).tool_calls[0]  # type: ignore[index]
    args = json.loads(call.function.arguments)
    assert args["command"].startswith("cat > steps.py << 'EOF'\ndef step_0(x):")
    assert args["command"].endswith("EOF") and "re-read it as evidence" in args["command"]
    assert prepared.budget_report.reductions.trimmed >= 1
    assert count_prepared(prepared, COUNTER) <= prepared.budget_report.used.total
