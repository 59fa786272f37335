"""The handoff a closing window commits and the next window's context, pure."""

from __future__ import annotations

from dataclasses import replace

from contracts import PathRule, PrepareRequest
from contracts.windows import RolloverTrigger
from services.core.assemble import ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from services.core.records import LedgerRecord
from services.core.state import Fact, StateView
from services.core.tokens import counter_for
from services.core.windows.handoff import build_handoff, render_handoff
from services.core.windows.next_window import roll_over, window_of
from tests.fixtures.builders import Thread, ledger_records

RULES = (
    PathRule(pattern="task.goal", kind="goal"),
    PathRule(pattern="task.rule", kind="constraint"),
    PathRule(pattern="question:{id}.text", kind="open_question"),
    PathRule(pattern="item:{id}.location", kind="business_fact"),
)


def _fact(path: str, value: object, key: str, seq: int, **extra: object) -> Fact:
    return Fact(
        path=path,
        value=value,
        status="known",
        source="tool_effect",
        event_key=key,
        seq=seq,
        observed_at=None,
        **extra,
    )  # type: ignore[arg-type]


def _depot() -> tuple[Thread, list[LedgerRecord], StateView]:
    """A state-heavy thread: item 9 moved twice (bay_2, then bay_4), a goal, a rule, a question."""
    t = Thread()
    events = [t.system("You run the depot."), t.user("Restock bay 4.", key="task")]
    events += [t.assistant("moving", calls=(("m1", "move_item", {"item_id": 9}),), key="a1")]
    events += [t.outcome("m1", '{"location": "bay_2"} ' + "log line " * 40, key="o1")]
    events += [t.assistant("moving again", calls=(("m2", "move_item", {"item_id": 9}),), key="a2")]
    events += [t.outcome("m2", '{"location": "bay_4"}', key="o2")]
    records = ledger_records(events)
    facts = {
        "item:9.location": _fact(
            "item:9.location", "bay_4", "o2", 6, supersedes="o1", superseded_value="bay_2", evidence=("o2",)
        ),
        "task.goal": _fact("task.goal", "restock bay 4", "task", 2),
        "task.rule": _fact("task.rule", "never empty bay 1", "task", 2),
        "question:1.text": _fact("question:1.text", "is aisle 3 open?", "a2", 5),
    }
    state = StateView(facts=facts, versions={"item:9": 2, "task": 2, "question:1": 1})
    return t, records, state


def _snapshot(t: Thread, records: list[LedgerRecord], state: StateView) -> ThreadSnapshot:
    return ThreadSnapshot(
        t.session_id,
        t.run_id,
        t.instance_id,
        len(records),
        records[-1].seq,
        records[-1].event_key,
        records,
        facts=tuple(state.facts.values()),
    )


def _request(t: Thread) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=8_000
    )


def test_build_handoff_names_goals_constraints_questions_and_state_without_copying_values() -> None:
    t, records, state = _depot()
    handoff, _ = roll_over(
        _snapshot(t, records, state),
        window=1,
        opened_after=0,
        state=state,
        rules=RULES,
        trigger=RolloverTrigger.HARD_LIMIT,
    )
    assert (handoff.previous_window, handoff.new_window, handoff.last_event_seq) == (1, 2, records[-1].seq)
    assert handoff.task_id == t.run_id and handoff.state_version == 5
    assert handoff.active_goal_ids == ("task.goal",)
    assert handoff.active_constraints == ("task.rule",)
    assert handoff.unresolved_questions == ("question:1.text",)
    assert handoff.required_state_paths == ("item:9.location", "question:1.text", "task.goal", "task.rule")
    assert handoff.required_evidence_ids == ("a2", "o2", "task")
    assert "bay_2" not in handoff.model_dump_json() and "bay_4" not in handoff.model_dump_json()


def test_build_handoff_is_the_same_for_the_same_state_and_differs_when_state_moved() -> None:
    t, records, state = _depot()
    snapshot = _snapshot(t, records, state)
    args = dict(window=1, opened_after=0, rules=RULES, trigger=RolloverTrigger.HARD_LIMIT)
    first, _ = roll_over(snapshot, state=state, **args)  # type: ignore[arg-type]
    again, _ = roll_over(snapshot, state=state, **args)  # type: ignore[arg-type]
    moved = StateView(
        facts={**state.facts, "item:9.location": _fact("item:9.location", "bay_5", "o3", 7)},
        versions={**state.versions, "item:9": 3},
    )
    other, _ = roll_over(snapshot, state=moved, **args)  # type: ignore[arg-type]
    assert first == again
    assert other.handoff_id != first.handoff_id and other.checkpoint_id != first.checkpoint_id


def test_next_window_shows_current_state_and_handoff_not_the_closed_window_history() -> None:
    t, records, state = _depot()
    _, snapshot = roll_over(
        _snapshot(t, records, state),
        window=1,
        opened_after=0,
        state=state,
        rules=RULES,
        trigger=RolloverTrigger.HARD_LIMIT,
    )
    prepared = assemble_context(snapshot, _request(t), resolve_budget(_request(t)), counter_for("o200k_base"))
    texts = [m.content or "" for m in prepared.messages]
    joined = "\n".join(texts)
    assert prepared.window == 2 and prepared.handoff_id is not None
    assert [b.block_id.split(":")[0] for b in prepared.blocks] == ["instruction", "task", "handoff", "state"]
    assert "log line" not in joined and "moving again" not in joined  # the closed window's history
    assert 'item:9.location = "bay_4" (CURRENT' in joined
    # The superseded value is only ever named as superseded, never as a current fact.
    assert 'item:9.location = "bay_2"' not in joined


def test_next_window_keeps_what_was_recorded_after_the_rollover() -> None:
    t, records, state = _depot()
    _, snapshot = roll_over(
        _snapshot(t, records, state),
        window=1,
        opened_after=0,
        state=state,
        rules=RULES,
        trigger=RolloverTrigger.HARD_LIMIT,
    )
    later = ledger_records([*_events_of(t), t.user("And now bay 5?", key="q2")])[-1]
    grown = replace(snapshot, records=[*snapshot.records, replace(later, seq=records[-1].seq + 1)])
    prepared = assemble_context(grown, _request(t), resolve_budget(_request(t)), counter_for("o200k_base"))
    assert "And now bay 5?" in (prepared.messages[-2].content or "") + (prepared.messages[-1].content or "")


def _events_of(t: Thread) -> list[object]:
    return [t.system("You run the depot."), t.user("Restock bay 4.", key="task")]


def test_window_of_numbers_records_by_the_seqs_windows_closed_after() -> None:
    assert [window_of(seq, (10, 25)) for seq in (1, 10, 11, 25, 26)] == [1, 1, 2, 2, 3]


def test_handoff_carries_the_files_modified_and_the_newest_failure_across_windows() -> None:
    t = Thread()
    first = ledger_records(
        [
            t.user("fix the parser", key="u1"),
            t.assistant(calls=(("c1", "write_file", {"path": "src/parse.py"}),), key="a1"),
            t.outcome("c1", "ok", key="r1"),
            t.assistant(calls=(("c2", "bash", {"command": "pytest"}),), key="a2"),
            t.outcome("c2", "E   AssertionError: 3 != 4\n1 failed", status="error", key="r2"),
        ]
    )
    common = dict(thread_id=t.thread_id, run_id=t.run_id, state=StateView(), rules=RULES)
    one = build_handoff(
        previous_window=1,
        last_event_seq=5,
        window=first,
        trigger=RolloverTrigger.HARD_LIMIT,
        **common,  # type: ignore[arg-type]
    )
    assert one.files_modified == ("src/parse.py",)
    assert one.last_failure is not None and "AssertionError: 3 != 4" in one.last_failure
    assert "src/parse.py" in render_handoff(one) and "AssertionError" in render_handoff(one)

    t2 = Thread(session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id)
    second = ledger_records(
        [
            t2.assistant(calls=(("c3", "edit_file", {"path": "src/lex.py"}),), key="a3"),
            t2.outcome("c3", "ok", key="r3"),
            t2.assistant(calls=(("c4", "bash", {"command": "pytest"}),), key="a4"),
            t2.outcome("c4", "4 passed", key="r4"),
        ]
    )
    two = build_handoff(
        previous_window=2,
        last_event_seq=9,
        window=second,
        trigger=RolloverTrigger.HARD_LIMIT,
        previous=one,
        **common,  # type: ignore[arg-type]
    )
    assert two.files_modified == ("src/parse.py", "src/lex.py")
    assert two.last_failure == one.last_failure  # carried: no failure in the second window


def test_handoff_carries_a_failure_only_the_output_shows_and_not_a_viewed_one() -> None:
    t = Thread()
    window = ledger_records(
        [
            t.user("make app.py start", key="u1"),
            t.assistant(calls=(("c1", "bash", {"command": "python app.py 2>&1 | tail"}),), key="a1"),
            t.outcome("c1", "Traceback (most recent call last):\nKeyError: 'port'", key="r1"),
            t.assistant(calls=(("c2", "bash", {"command": "cat old.log"}),), key="a2"),
            t.outcome("c2", "Traceback (most recent call last):\nValueError: old", key="r2"),
        ]
    )
    handoff = build_handoff(
        previous_window=1,
        last_event_seq=5,
        window=window,
        trigger=RolloverTrigger.HARD_LIMIT,
        thread_id=t.thread_id,
        run_id=t.run_id,
        state=StateView(),
        rules=RULES,
    )
    assert handoff.last_failure is not None and handoff.last_failure.endswith("error: KeyError: 'port'")
