"""The Anthropic Messages adapter against the official SDK's request types, on real prepared contexts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anthropic.types as at
import pytest
from pydantic import TypeAdapter

from contracts import (
    ChatMessage,
    PrepareRequest,
    PreparedContext,
    ToolOutcomePayload,
    ToolSchema,
    decode_event,
)
from contracts.prepare import ChatFunction, ChatToolCall
from services.core.assemble import SummaryView, ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from services.core.providers.anthropic_messages import (
    CONTINUES_TEXT,
    MAX_BREAKPOINTS,
    SYSTEM_PREFIX,
    anthropic_request,
    cache_breakpoints,
    content_sources,
)
from services.core.providers.bundle import ContextBundle
from services.core.records import LedgerRecord
from services.core.tokens import counter_for
from contracts.exceptions import InvalidRequest
from tests.fixtures.sdk import conforms
from tests.fixtures.builders import Thread, ledger_records

PREPARE_GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "prepare"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "providers" / "anthropic.messages"
COUNTER = counter_for("o200k_base")
MESSAGES: TypeAdapter[list[at.MessageParam]] = TypeAdapter(list[at.MessageParam])
TOOLS: TypeAdapter[list[at.ToolParam]] = TypeAdapter(list[at.ToolParam])
SYSTEM: TypeAdapter[list[at.TextBlockParam]] = TypeAdapter(list[at.TextBlockParam])
BASH = {
    "name": "bash",
    "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
EDITOR = {
    "name": "str_replace_editor",
    "description": "View, create and edit files. " * 20,
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
            "path": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
        },
        "required": ["command", "path"],
    },
}


# --- building contexts as tests/unit/test_assemble.py does ---------------------------------------


def _snapshot(t: Thread, records: list[LedgerRecord], summary: SummaryView | None = None) -> ThreadSnapshot:
    return ThreadSnapshot(
        t.session_id,
        t.run_id,
        t.instance_id,
        len(records),
        records[-1].seq,
        records[-1].event_key,
        records,
        view_revision=1 if summary else 0,
        covered_to=summary.covered_to if summary else 0,
        summary=summary,
    )


def _prepare(
    t: Thread,
    records: list[LedgerRecord],
    budget: int = 100_000,
    summary: SummaryView | None = None,
    **request: object,
) -> PreparedContext:
    req = PrepareRequest.model_validate(
        {
            "session_id": t.session_id,
            "run_id": t.run_id,
            "instance_id": t.instance_id,
            "budget_tokens": budget,
            "format": "anthropic.messages",
            **request,
        }
    )
    return assemble_context(_snapshot(t, records, summary), req, resolve_budget(req), COUNTER)


def _summary(records: list[LedgerRecord], covered_to: int, text: str) -> SummaryView:
    return SummaryView(
        summary_id="sum-1",
        view_revision=1,
        covered_from=1,
        covered_to=covered_to,
        text=text,
        tokens_o200k=COUNTER.count(text),
        tokens_cl100k=counter_for("cl100k_base").count(text),
        sources=tuple(r.seq for r in records if r.seq <= covered_to),
    )


def _failed(records: list[LedgerRecord]) -> frozenset[str]:
    return frozenset(
        r.body.call_id
        for r in records
        if isinstance(r.body, ToolOutcomePayload) and r.body.status.value != "success"
    )


def _bundle(prepared: PreparedContext, records: list[LedgerRecord]) -> ContextBundle:
    return ContextBundle(
        prepared.messages, tuple(t.function for t in prepared.tools), prepared.blocks, _failed(records)
    )


def _golden(case: str) -> tuple[ContextBundle, PreparedContext]:
    data = json.loads((PREPARE_GOLDEN / f"{case}.json").read_text())
    events = [decode_event(json.dumps(e).encode(), max_bytes=1 << 20) for e in data["events"]]
    request = PrepareRequest.model_validate(data["request"])
    first = events[0]
    t = Thread(session_id=first.session_id, run_id=first.run_id, instance_id=first.instance_id)
    records = ledger_records(events, **data.get("limits", {}))
    options = {"allow_drop_history": bool(data.get("options", {}).get("allow_drop_history", False))}
    prepared = assemble_context(_snapshot(t, records), request, resolve_budget(request), COUNTER, **options)
    return _bundle(prepared, records), prepared


def _long_history(t: Thread, groups: int) -> list[Any]:
    """A replay-like coding session: long instructions, a task, then many tool groups, some failing."""
    events: list[Any] = [
        t.system("You are a software engineering agent working in a repository. " * 30),
        t.user("The test tests/test_schema.py::test_dump fails with a KeyError; fix the bug."),
    ]
    for n in range(groups):
        call = (f"call_{n}", "bash", {"cmd": f"sed -n {n * 40},{n * 40 + 40}p src/module_{n % 7}.py"})
        events.append(t.assistant(f"Step {n}: reading module {n % 7}.", calls=(call,)))
        failed = n % 5 == 4
        text = "".join(
            f"    line {n}.{i}: value = compute({i}, key='k{i}')\n" for i in range(30 + n % 4 * 20)
        )
        events.append(t.outcome(f"call_{n}", text, status="error" if failed else "success"))
        if n % 9 == 8:
            events.append(t.user(f"Keep going; remember to run the tests after step {n}."))
    return events


# --- checks every request must pass -------------------------------------------------------------


def _content(request: dict[str, Any]) -> list[tuple[int, int, dict[str, Any]]]:
    """Every content block of the messages as (message index, block index, block)."""
    messages: list[dict[str, Any]] = request["messages"]
    return [(i, j, b) for i, m in enumerate(messages) for j, b in enumerate(m["content"])]


def _breakpoints(request: dict[str, Any]) -> list[tuple[str, int, int]]:
    """Where ``cache_control`` is set: ("tools", i, 0), ("system", i, 0), ("messages", i, j)."""
    found: list[tuple[str, int, int]] = []
    for key in ("tools", "system"):
        items: list[dict[str, Any]] = request.get(key, [])
        found += [(key, i, 0) for i, b in enumerate(items) if "cache_control" in b]
    found += [("messages", i, j) for i, j, b in _content(request) if "cache_control" in b]
    return found


def _no_nulls(value: object) -> bool:
    if isinstance(value, dict):
        return all(v is not None and _no_nulls(v) for v in value.values())
    if isinstance(value, list):
        return all(v is not None and _no_nulls(v) for v in value)
    return True


def _check(request: dict[str, Any], bundle: ContextBundle) -> None:
    assert set(request) <= {"system", "messages", "tools"}
    conforms(MESSAGES, request["messages"])
    conforms(TOOLS, request.get("tools", []))
    conforms(SYSTEM, request.get("system", []))
    assert _no_nulls(request)
    messages: list[dict[str, Any]] = request["messages"]
    roles = [m["role"] for m in messages]
    assert roles[:1] == ["user"]
    assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2)
    blocks = _content(request)
    assert all(b["text"] for _, _, b in blocks if b["type"] == "text")
    assert all(b["text"] for b in request.get("system", []))
    # Every tool_use is answered at the top of the next user message, in call order.
    for i, m in enumerate(messages):
        uses = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
        if uses:
            answered = [b["tool_use_id"] for b in messages[i + 1]["content"] if b["type"] == "tool_result"]
            assert answered == uses
            assert [b["type"] for b in messages[i + 1]["content"][: len(uses)]] == ["tool_result"] * len(uses)
    # Nothing is lost: every canonical text and call is somewhere in the request.
    texts = [b.get("text") or b.get("content") for _, _, b in blocks]
    texts += [b["text"] for b in request.get("system", [])]
    for canonical in bundle.messages:
        if canonical.content:
            assert any(isinstance(x, str) and canonical.content in x for x in texts), canonical.content[:80]
    calls = [(c.function.name, c.function.arguments) for m in bundle.messages for c in m.tool_calls or ()]
    uses_out = [(b["name"], b["input"]) for _, _, b in blocks if b["type"] == "tool_use"]
    assert len(uses_out) == len(calls)
    for (name, arguments), (out_name, out_input) in zip(calls, uses_out, strict=True):
        assert name == out_name
        assert out_input == {"arguments": arguments} or out_input == json.loads(arguments)
    results = [b for _, _, b in blocks if b["type"] == "tool_result"]
    tool_ids = [m.tool_call_id for m in bundle.messages if m.role == "tool"]
    assert len(results) == len(tool_ids)
    assert sum(1 for b in results if b.get("is_error")) == sum(
        1 for i in tool_ids if i in bundle.error_call_ids
    )
    marks = _breakpoints(request)
    assert len(marks) <= MAX_BREAKPOINTS
    assert all(b["cache_control"] == {"type": "ephemeral"} for _, _, b in blocks if "cache_control" in b)


def _cached_share(request: dict[str, Any]) -> float:
    """Tokens (o200k of the JSON, an estimate) of the prefix up to the last breakpoint, over all."""

    def tokens(body: dict[str, Any]) -> int:
        return COUNTER.count(json.dumps(body, ensure_ascii=False))

    marks = _breakpoints(request)
    if not marks:
        return 0.0
    key, i, j = marks[-1]
    body: dict[str, Any] = {k: request[k] for k in ("tools", "system", "messages") if k in request}
    prefix: dict[str, Any] = {}
    for k in ("tools", "system", "messages"):
        if k not in body:
            continue
        if k != key:
            prefix[k] = body[k]
            continue
        if k == "messages":
            kept = body[k][:i]
            last = body[k][i]
            prefix[k] = [*kept, {"role": last["role"], "content": last["content"][: j + 1]}]
        else:
            prefix[k] = body[k][: i + 1]
        break
    return tokens(prefix) / tokens(body)


def _unmarked(value: Any) -> Any:
    """``value`` without its breakpoint markers: they say where to cache, not what the prefix holds."""
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _prefix_through(request: dict[str, Any], mark: tuple[str, int, int]) -> object:
    request = _unmarked(request)
    key, i, j = mark
    order: list[str] = [k for k in ("tools", "system", "messages") if k in request]
    out: list[object] = [request[k] for k in order[: order.index(key)]]
    items: list[Any] = request[key]
    if key == "messages":
        out.append([*items[:i], {"role": items[i]["role"], "content": items[i]["content"][: j + 1]}])
    else:
        out.append(items[: i + 1])
    return out


# --- golden cases --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(p.stem for p in PREPARE_GOLDEN.glob("*.json")))
def test_golden_prepared_contexts_render_as_valid_messages_requests(case: str) -> None:
    bundle, prepared = _golden(case)
    request: dict[str, Any] = anthropic_request(bundle)
    _check(request, bundle)
    # Breakpoints: the last tool, the last system block, the end of the task (the golden cases have
    # no summary, and their first block after the task is a tool group or a state note).
    marks = _breakpoints(request)
    assert marks[:2] == [("tools", len(prepared.tools) - 1, 0), ("system", 0, 0)]
    first_interaction = next(n for n, b in enumerate(prepared.blocks) if b.kind.value == "interaction")
    last_task = [b for b in prepared.blocks[:first_interaction] if b.kind.value == "task"][-1]
    text = prepared.messages[last_task.first_message + last_task.message_count - 1].content
    _, i, j = marks[2]
    assert _content(request)[[(a, b) for a, b, _ in _content(request)].index((i, j))][2]["text"] == text
    # The fourth: the end of the history, before the trailing evidence and state.
    assert len(marks) <= 4 and marks[-1][0] == "messages"
    path = GOLDEN / f"{case}.json"
    if os.environ.get("CTX_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"request": request}, indent=2, ensure_ascii=False) + "\n")
    assert json.loads(path.read_text()) == {"request": request}


def test_every_prepare_golden_case_has_an_anthropic_golden() -> None:
    assert {p.stem for p in GOLDEN.glob("*.json")} == {p.stem for p in PREPARE_GOLDEN.glob("*.json")}


def test_golden_failed_outcome_is_an_error_result() -> None:
    bundle, _ = _golden("coding_turn_with_trimmed_result")
    request: dict[str, Any] = anthropic_request(bundle)
    results = [b for _, _, b in _content(request) if b["type"] == "tool_result"]
    assert [(b["tool_use_id"], b.get("is_error", False)) for b in results] == [("c1", True), ("c2", False)]


# --- tool groups, failures, summaries ------------------------------------------------------------


def test_parallel_results_are_one_user_message_in_call_order_with_the_user_text_after() -> None:
    t = Thread()
    events = [t.system("Sys."), t.user("old question")]
    events += [t.assistant("Looking.", calls=(("a", "ls", {}), ("b", "cat", {"p": "x"}), ("c", "pwd", {})))]
    events += [t.outcome("c", "/w"), t.outcome("a", "file " * 5, status="error"), t.outcome("b", "text")]
    events += [t.user("now?")]
    records = ledger_records(events)
    prepared = _prepare(t, records, tools=[BASH])
    bundle = _bundle(prepared, records)
    request: dict[str, Any] = anthropic_request(bundle)
    _check(request, bundle)
    messages: list[dict[str, Any]] = request["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["type"] for b in messages[1]["content"]] == ["text", "tool_use", "tool_use", "tool_use"]
    assert [(b["id"], b["input"]) for b in messages[1]["content"][1:]] == [
        ("a", {}),
        ("b", {"p": "x"}),
        ("c", {}),
    ]
    results = messages[2]["content"]
    assert [(b["type"], b.get("tool_use_id"), b.get("is_error")) for b in results] == [
        ("tool_result", "a", True),
        ("tool_result", "b", None),
        ("tool_result", "c", None),
        ("text", None, None),
    ]
    assert results[2]["content"] == "/w" and results[3]["text"] == "now?"


def test_a_body_with_tool_blocks_and_no_tools_is_an_invalid_request_naming_the_called_tools() -> None:
    t = Thread()
    events = [t.system("Sys."), t.user("q"), t.assistant(calls=(("a", "ls", {}),)), t.outcome("a", "x")]
    records = ledger_records(events)
    with pytest.raises(InvalidRequest) as refused:
        _prepare(t, records)
    assert refused.value.details == {"format": "anthropic.messages", "missing": "tools", "called": ["ls"]}
    # With the tools, or in another format, or with no tool blocks, the same thread prepares.
    assert _prepare(t, records, tools=[BASH]).request is not None
    assert _prepare(t, records, format="openai.responses").request is not None
    assert _prepare(t, ledger_records(events[:2])).request is not None


def test_breakpoints_end_tools_system_and_the_summary() -> None:
    t = Thread()
    events: list[Any] = [t.system("Rules."), t.user("Fix the failing test in app.py")]
    for n in range(4):
        events += [
            t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat f{n}"}),)),
            t.outcome(f"c{n}", f"out {n}"),
        ]
    records = ledger_records(events)
    summary = _summary(records, 6, "Read f0 and f1: both fine.")
    prepared = _prepare(t, records, summary=summary, tools=[BASH, EDITOR])
    assert [b.kind.value for b in prepared.blocks][:3] == ["instruction", "task", "summary"]
    bundle = _bundle(prepared, records)
    request: dict[str, Any] = anthropic_request(bundle)
    _check(request, bundle)
    marks = _breakpoints(request)
    assert marks[:2] == [("tools", 1, 0), ("system", 0, 0)]
    _, i, j = marks[2]
    blocks = {(a, b): block for a, b, block in _content(request)}
    # The task and the summary are one user message; the breakpoint ends it, before the history.
    assert (i, j) == (0, 1) and blocks[(0, 1)]["text"] == "Read f0 and f1: both fine."
    assert blocks[(0, 0)]["text"] == "Fix the failing test in app.py"


def test_breakpoints_stay_on_content_that_the_next_prepare_repeats() -> None:
    t = Thread()
    events = _long_history(t, 30)
    before = ledger_records(events)
    events += [t.assistant("One more look.", calls=(("next", "bash", {"cmd": "pytest -q"}),))]
    events += [t.outcome("next", "1 failed, 40 passed", status="error")]
    after = ledger_records(events)
    bundles = [_bundle(_prepare(t, r, tools=[BASH, EDITOR]), r) for r in (before, after)]
    first, second = (anthropic_request(b) for b in bundles)
    _check(first, bundles[0])
    _check(second, bundles[1])
    marks = _breakpoints(first)
    # The stable three stay put; the fourth, the end of the history, moves on with it, and the next
    # prepare repeats everything up to where it was, so that request reads it from the cache.
    assert len(marks) == 4 and marks[:3] == _breakpoints(second)[:3] and _breakpoints(second)[3] > marks[3]
    for mark in marks:
        assert _prefix_through(first, mark) == _prefix_through(second, mark)


def test_cached_share_is_measured_before_the_last_breakpoint() -> None:
    t = Thread()
    events = _long_history(t, 60)
    records = ledger_records(events)
    prepared = _prepare(t, records, budget=200_000, tools=[BASH, EDITOR])
    request = anthropic_request(_bundle(prepared, records))
    share = _cached_share(request)
    # Everything but the newest evidence and state lies before the last breakpoint (>= 90%).
    assert share >= 0.9
    whole = {k: request[k] for k in ("tools", "system", "messages") if k in request}
    assert share * COUNTER.count(json.dumps(whole, ensure_ascii=False)) > COUNTER.count(
        json.dumps(request["system"], ensure_ascii=False)
    )


# --- the shape rules on hand-made bundles --------------------------------------------------------


def _call(call_id: str, name: str, arguments: str) -> ChatToolCall:
    return ChatToolCall(id=call_id, function=ChatFunction(name=name, arguments=arguments))


def test_shape_rules_opening_assistant_late_system_merges_odd_arguments_and_ids() -> None:
    messages = (
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="system", content=""),
        ChatMessage(role="assistant", content="Earlier I found the bug."),
        ChatMessage(
            role="assistant",
            content="",
            tool_calls=(
                _call("x@child1", "bash", "[1, 2]"),
                _call("x:child1", "bash", "not json"),
                _call("y", "edit", '{"path": "a.py"}'),
            ),
        ),
        ChatMessage(role="tool", tool_call_id="y", content="edited"),
        ChatMessage(role="tool", tool_call_id="x@child1", content=""),
        ChatMessage(role="tool", tool_call_id="x:child1", content="two"),
        ChatMessage(role="user", content=""),
        ChatMessage(role="system", content="Now wrap up."),
        ChatMessage(role="user", content="Thanks."),
    )
    tools = (
        ToolSchema(name="bash"),
        ToolSchema(name="edit", description="Edit", parameters={"type": "object"}),
    )
    bundle = ContextBundle(messages, tools, (), frozenset({"x:child1"}))
    request: dict[str, Any] = anthropic_request(bundle)
    _check(request, bundle)
    assert request["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    assert request["tools"] == [
        {"name": "bash", "input_schema": {"type": "object"}},
        {
            "name": "edit",
            "description": "Edit",
            "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"},
        },
    ]
    out: list[dict[str, Any]] = request["messages"]
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[0]["content"] == [{"type": "text", "text": CONTINUES_TEXT}]
    uses = out[1]["content"]
    assert uses[0] == {"type": "text", "text": "Earlier I found the bug."}
    assert [u["input"] for u in uses[1:]] == [
        {"arguments": "[1, 2]"},
        {"arguments": "not json"},
        {"path": "a.py"},
    ]
    ids = [u["id"] for u in uses[1:]]
    assert ids[2] == "y" and len(set(ids)) == 3
    assert all(c.isalnum() or c in "_-" for i in ids for c in i)
    results = out[2]["content"]
    assert [r.get("tool_use_id") for r in results] == [*ids, None, None]
    assert results[0] == {"type": "tool_result", "tool_use_id": ids[0]}  # empty output: no content
    assert results[1] == {"type": "tool_result", "tool_use_id": ids[1], "content": "two", "is_error": True}
    assert results[3:] == [
        {"type": "text", "text": f"{SYSTEM_PREFIX} Now wrap up."},
        {"type": "text", "text": "Thanks."},
    ]
    # No blocks, so no head: only the tools and system breakpoints.
    assert len(_breakpoints(request)) == 2


def _marked_sources(request: dict[str, Any], messages: tuple[ChatMessage, ...]) -> set[int]:
    """The canonical message each system or message breakpoint ends."""
    blocks = [*request.get("system", []), *(b for _, _, b in _content(request))]
    sources = content_sources(messages)
    return {sources[n] for n, b in enumerate(blocks) if "cache_control" in b}


@pytest.mark.parametrize("case", sorted(p.stem for p in PREPARE_GOLDEN.glob("*.json")))
def test_cache_breakpoints_name_the_messages_the_request_marks(case: str) -> None:
    bundle, prepared = _golden(case)
    expected = _marked_sources(anthropic_request(bundle), prepared.messages)
    assert {n - 1 for n in cache_breakpoints(prepared.messages, prepared.blocks)} == expected


def test_cache_breakpoints_end_the_summary_when_the_head_has_one() -> None:
    t = Thread()
    events: list[Any] = [t.system("Rules."), t.user("Fix the failing test in app.py")]
    for n in range(4):
        events += [
            t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat f{n}"}),)),
            t.outcome(f"c{n}", f"out {n}"),
        ]
    records = ledger_records(events)
    prepared = _prepare(t, records, summary=_summary(records, 6, "Read f0 and f1: both fine."), tools=[BASH])
    request = anthropic_request(_bundle(prepared, records))
    marks = cache_breakpoints(prepared.messages, prepared.blocks)
    assert {n - 1 for n in marks} == _marked_sources(request, prepared.messages) and len(marks) == 3
