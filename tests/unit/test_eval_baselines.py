"""Baselines: what full-history, windowing and masking agents send, never splitting a tool group."""

from __future__ import annotations

import pytest

from services.core.evaluation import (
    MASK_MARKER,
    Baseline,
    ContextCounter,
    baseline_context,
    count_context,
    history_of,
    mask_old_outputs,
    with_system_prompt,
)
from services.core.evaluation.chat import ChatMsg
from services.core.evaluation.synthetic import synthetic_trace
from services.core.tokens import counter_for

from .test_eval_synthetic import TraceBuilder

COUNTER = ContextCounter(counter_for("o200k_base"))


def _multi_call_trace(groups: int = 30) -> TraceBuilder:
    t = TraceBuilder().system("You are an agent.").user("Fix the bug in app.py.")
    for g in range(groups):
        t.call(
            f"step {g}",
            (f"a{g}", "bash", {"command": f"cat f{g}.py"}),
            (f"b{g}", "bash", {"command": f"ls d{g}"}),
        )
        t.result(f"a{g}", f"content of f{g}\n" * (5 + g % 7)).result(f"b{g}", f"listing {g}\n" * 3)
        if g % 10 == 9:
            t.user(f"Also check module {g}.")
    return t


def _assert_no_split_group(messages: tuple[ChatMsg, ...]) -> None:
    calls = {c["id"] for m in messages for c in m.get("tool_calls") or []}  # type: ignore[union-attr, index]
    results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert set(results) == calls, "a call without its result or a result without its call"
    for i, m in enumerate(messages):
        if m["role"] == "tool":  # a result follows its call's message or a sibling result
            assert messages[i - 1]["role"] in ("assistant", "tool")


@pytest.mark.parametrize("kind", [Baseline.WINDOW, Baseline.MASKING])
@pytest.mark.parametrize("budget", [400, 900, 2000, 5000])
def test_window_and_masking_fit_the_budget_and_never_split_a_group(kind: Baseline, budget: int) -> None:
    history = history_of(_multi_call_trace().lines)
    context = baseline_context(kind, history, budget, COUNTER)
    assert not context.failed
    assert context.tokens == count_context(context.messages, COUNTER.counter) <= budget
    _assert_no_split_group(context.messages)
    assert context.messages[:2] == (*history.system, *history.task)


def test_window_keeps_the_newest_units_contiguously_and_drops_the_oldest() -> None:
    history = history_of(_multi_call_trace().lines)
    context = baseline_context(Baseline.WINDOW, history, 1500, COUNTER)
    kept = list(context.messages[2:])
    whole = [m for u in history.units for m in u.messages]
    assert 0 < len(kept) < len(whole) and kept == whole[len(whole) - len(kept) :]


def test_window_sends_everything_when_it_fits() -> None:
    history = history_of(_multi_call_trace(3).lines)
    context = baseline_context(Baseline.WINDOW, history, 100_000, COUNTER)
    assert list(context.messages) == history.messages()


def test_masking_replaces_all_but_the_newest_outputs_with_the_marker() -> None:
    history = history_of(_multi_call_trace(10).lines)
    masked = [m for u in mask_old_outputs(history.units, 5) for m in u.messages if m["role"] == "tool"]
    original = [m for u in history.units for m in u.messages if m["role"] == "tool"]
    assert [m["content"] for m in masked[:-5]] == [MASK_MARKER] * (len(original) - 5)
    assert masked[-5:] == original[-5:]
    context = baseline_context(Baseline.MASKING, history, 100_000, COUNTER)
    assert context.tokens < baseline_context(Baseline.FULL, history, 100_000, COUNTER).tokens


def test_full_history_over_the_budget_is_a_failed_request() -> None:
    history = history_of(_multi_call_trace().lines)
    full = baseline_context(Baseline.FULL, history, 1000, COUNTER)
    assert full.failed and list(full.messages) == history.messages() and full.tokens > 1000


@pytest.mark.parametrize("kind", [Baseline.WINDOW, Baseline.MASKING])
def test_a_baseline_whose_system_and_task_alone_exceed_the_budget_fails(kind: Baseline) -> None:
    lines = with_system_prompt(_multi_call_trace().lines, "Rule. " * 500)
    context = baseline_context(kind, history_of(lines), 400, COUNTER)
    assert context.failed and context.tokens > 400


def test_with_system_prompt_puts_the_prompt_before_the_trace_system_text() -> None:
    lines = with_system_prompt(_multi_call_trace(1).lines, "BIG PROMPT")
    assert lines[0].text == "BIG PROMPT\n\nYou are an agent." and len(lines) == len(
        _multi_call_trace(1).lines
    )


def test_history_groups_each_assistant_message_with_all_its_results() -> None:
    history = history_of(synthetic_trace(20))
    for unit in history.units:
        roles = [m["role"] for m in unit.messages]
        assert roles in (["user"], ["assistant"], ["assistant", *["tool"] * unit.tool_results])
