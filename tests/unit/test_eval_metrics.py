"""Counting, cache reuse and per-trace scoring: the arithmetic behind the eval's figures."""

from __future__ import annotations

import pytest

from services.core.evaluation import (
    CTXFLEET,
    ContextCounter,
    FleetContext,
    FleetFailure,
    FleetOutcome,
    common_prefix,
    count_message,
    history_of,
    prepare_points,
    score_trace,
    with_system_prompt,
)
from services.core.evaluation.chat import ChatMsg
from services.core.evaluation.fair_count import (
    MESSAGE_FRAMING,
    REPLY_PRIMING,
    TOOL_CALL_FRAMING,
    count_context,
    count_tools,
)
from services.core.tokens import counter_for

from .test_eval_synthetic import TraceBuilder

O200K = counter_for("o200k_base")
COUNTER = ContextCounter(O200K)


def _trace(steps: int = 8, size: int = 40) -> TraceBuilder:
    t = TraceBuilder().system("You are an agent.").user("Fix the failing test in calc.py. Never edit tests/.")
    for i in range(steps):
        t.bash(f"c{i}", f"cat calc_{i}.py", f"line of calc {i}\n" * size)
    return t.say("done")


def test_a_tool_call_costs_its_id_name_arguments_and_framing() -> None:
    bare: ChatMsg = {"role": "assistant", "content": "x"}
    call: ChatMsg = {
        **bare,
        "tool_calls": [
            {
                "id": "call_abc123",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command":"ls"}'},
            }
        ],
    }
    extra = (
        TOOL_CALL_FRAMING + O200K.count("call_abc123") + O200K.count("bash") + O200K.count('{"command":"ls"}')
    )
    assert count_message(call, O200K) - count_message(bare, O200K) == extra
    tool: ChatMsg = {"role": "tool", "tool_call_id": "call_abc123", "content": "out"}
    assert count_message(tool, O200K) == MESSAGE_FRAMING + O200K.count("tool") + O200K.count(
        "out"
    ) + O200K.count("call_abc123")
    tools = [{"name": "bash", "description": "run", "parameters": {"type": "object"}}]
    assert (
        count_context([bare], O200K, tools)
        == count_tools(tools, O200K) + count_message(bare, O200K) + REPLY_PRIMING
        > 0
    )


def test_common_prefix_counts_leading_equal_messages() -> None:
    a: list[ChatMsg] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "user", "content": "x"},
    ]
    b: list[ChatMsg] = [*a[:2], {"role": "user", "content": "y"}]
    assert common_prefix(a, b) == 2 and common_prefix(a, a) == 3 and common_prefix([], a) == 0


def _fleet_contexts(lines: TraceBuilder, make: object) -> list[FleetOutcome]:
    points = prepare_points(lines.lines)
    return [make(history_of(lines.lines[:i]).messages()) for i in points]  # type: ignore[operator]


def test_cache_reuse_is_the_token_weighted_share_of_each_context_repeating_the_previous_prefix() -> None:
    t = _trace()
    system: ChatMsg = {"role": "system", "content": "You are an agent."}
    contexts: list[tuple[ChatMsg, ...]] = [
        (system, {"role": "user", "content": "a " * 50}),
        (
            system,
            {"role": "user", "content": "a " * 50},
            {"role": "user", "content": "b " * 30},
        ),  # extends: all but the new message
        (system, {"role": "user", "content": "c " * 70}),  # rewritten after the system message
    ]
    outcomes: list[FleetOutcome] = [FleetContext(c) for c in contexts]
    outcomes += [FleetFailure("context_budget_exceeded", "too big")] * (len(prepare_points(t.lines)) - 3)
    score = score_trace("t", t.lines, 10_000, outcomes, COUNTER).systems[CTXFLEET]
    m = [count_message(x, O200K) for x in (system, contexts[0][1], contexts[1][2], contexts[2][1])]
    shared = (m[0] + m[1]) + m[0]
    later = (m[0] + m[1] + m[2] + REPLY_PRIMING) + (m[0] + m[3] + REPLY_PRIMING)
    assert (score.prefix_tokens, score.later_tokens) == (shared, later)
    assert score.cache_reuse == pytest.approx(shared / later)


def test_only_contexts_whose_full_history_exceeds_the_budget_are_probed() -> None:
    t = _trace()
    full = [COUNTER.context(history_of(t.lines[:i]).messages()) for i in prepare_points(t.lines)]
    budget = full[len(full) // 2]
    result = score_trace("t", t.lines, budget, _fleet_contexts(t, lambda m: FleetContext(tuple(m))), COUNTER)
    assert [p["prepare"] for p in result.points] == [i + 1 for i, f in enumerate(full) if f > budget]
    assert all(s.scored == sum(f > budget for f in full) for s in result.systems.values())


def test_a_fleet_sending_the_whole_history_passes_every_probe_and_full_fails_each_probed_context() -> None:
    t = _trace()
    result = score_trace("t", t.lines, 600, _fleet_contexts(t, lambda m: FleetContext(tuple(m))), COUNTER)
    fleet, full = result.systems[CTXFLEET], result.systems["full"]
    assert fleet.scored > 0 and all(p.passed == p.total for p in fleet.probes.values())
    assert fleet.over_budget == fleet.scored and fleet.failed == 0  # sent, but over the budget by this count
    assert full.failed == full.scored and all(p.passed == 0 for p in full.probes.values())
    assert fleet.tokens == full.tokens


def test_failed_prepares_are_counted_and_split_by_whether_required_content_fits() -> None:
    t = _trace()
    n = len(prepare_points(t.lines))
    failures: list[FleetOutcome] = [FleetFailure("context_budget_exceeded", "no")] * n
    fits = score_trace("t", t.lines, 600, failures, COUNTER).systems[CTXFLEET]
    assert fits.failed == fits.failed_required_fits == n and fits.tokens == 0
    big = with_system_prompt(t.lines, "Rule. " * 400)
    pinned = score_trace("t", big, 600, failures, COUNTER).systems[CTXFLEET]
    assert pinned.failed == n and pinned.failed_required_fits == 0
    assert [m["probe"] for m in fits.misses] == ["task", "files_read", "last_outcome", "constraints"]


def test_score_trace_needs_one_fleet_outcome_per_prepare() -> None:
    with pytest.raises(ValueError, match="fleet outcomes"):
        score_trace("t", _trace().lines, 600, [], COUNTER)


def test_aggregate_json_is_byte_identical_for_the_same_inputs() -> None:
    import json

    t = _trace()
    runs = [
        json.dumps(
            score_trace(
                "t", t.lines, 700, _fleet_contexts(t, lambda m: FleetContext(tuple(m[-3:]))), COUNTER
            ).as_json()
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
