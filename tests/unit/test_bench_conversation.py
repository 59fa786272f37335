"""The benchmarks' threads built from the bundled samples are threads the recorder accepts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from benchmarks.conversation import sample_events, sample_lines
from contracts import AssistantMessageEvent, SystemEvent, ToolOutcomeEvent

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n", [20, 50, 500, 5_000])
def test_sample_thread_has_exactly_n_records_in_one_thread(n: int) -> None:
    events = sample_events("s-bench", n, start=3)
    assert len(events) == n
    assert {e.thread_id for e in events} == {events[0].thread_id}
    assert len({e.event_key for e in events}) == n


def test_sample_thread_longer_than_all_samples_keeps_one_system_line_first() -> None:
    lines = sample_lines(2_000)
    assert lines[0].kind == "system"
    assert [line.kind for line in lines].count("system") == 1


def test_sample_thread_answers_each_call_once_and_only_after_it() -> None:
    asked: set[str] = set()
    answered: set[str] = set()
    for event in sample_events("s-bench", 3_000, start=1):
        if isinstance(event, AssistantMessageEvent):
            ids = {c.call_id for c in event.payload.tool_calls}
            assert not ids & asked, "a call id repeats across laps"
            asked |= ids
        elif isinstance(event, ToolOutcomeEvent):
            assert event.payload.call_id in asked
            assert event.payload.call_id not in answered
            answered.add(event.payload.call_id)


@pytest.mark.parametrize("start", range(6))
def test_sample_thread_leaves_open_only_the_calls_of_its_last_assistant_message(start: int) -> None:
    # An open call mid-thread would stay pending for ever, and nothing after it can be compacted;
    # only the cut at ``n`` may leave the last message's calls unanswered.
    open_calls: set[str] = set()
    last_calls: set[str] = set()
    for event in sample_events("s-bench", 2_000, start=start):
        if isinstance(event, AssistantMessageEvent) and event.payload.tool_calls:
            last_calls = {c.call_id for c in event.payload.tool_calls}
            open_calls |= last_calls
        elif isinstance(event, ToolOutcomeEvent):
            open_calls.discard(event.payload.call_id)
    assert open_calls <= last_calls


def test_sessions_starting_at_different_samples_differ() -> None:
    first = sample_events("s-a", 50, start=0)
    second = sample_events("s-b", 50, start=1)
    assert isinstance(first[0], SystemEvent) and isinstance(second[0], SystemEvent)
    assert [e.payload for e in first[1:]] != [e.payload for e in second[1:]]


def test_langgraphs_postgres_checkpointer_is_imported_only_inside_the_side_by_side_benchmark() -> None:
    # `make test` installs no `bench` extra: nothing it imports may need the checkpointer at import time
    # (LangChain and LangGraph themselves come with the dev extra, for the adapters' tests).
    for path in [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("tests/**/*.py")]:
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom) and n.level == 0}
        assert not any(m.startswith(("langgraph.checkpoint.postgres", "psycopg")) for m in names), path
