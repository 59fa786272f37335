"""OpenAI shapes, checked against the official SDK's own request types: the canonical Chat messages
and tools of real assembled contexts, and the Responses body the adapter renders from them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from openai.types.responses import FunctionToolParam, ResponseInputParam
from pydantic import TypeAdapter, ValidationError

from contracts import (
    ChatMessage,
    PrepareRequest,
    PreparedContext,
    ToolOutcomePayload,
    ToolSchema,
    ToolStatus,
    decode_event,
)
from services.core.assemble import SummaryView, ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from services.core.providers.bundle import ContextBundle
from services.core.providers.openai_responses import responses_request
from services.core.records import LedgerRecord
from services.core.tokens import counter_for
from tests.fixtures.sdk import conforms
from tests.fixtures.builders import Thread, ledger_records

COUNTER = counter_for("o200k_base")
GOLDEN_PREPARE = Path(__file__).resolve().parents[1] / "golden" / "prepare"
GOLDEN_RESPONSES = Path(__file__).resolve().parents[1] / "golden" / "providers" / "openai.responses"
CASES = sorted(p.stem for p in GOLDEN_PREPARE.glob("*.json"))
BASH = {"name": "bash", "description": "Run a shell command", "parameters": {"type": "object"}}

CHAT_MESSAGES = TypeAdapter(list[ChatCompletionMessageParam])
CHAT_TOOLS = TypeAdapter(list[ChatCompletionToolParam])
RESPONSES_INPUT = TypeAdapter(ResponseInputParam)
RESPONSES_TOOLS = TypeAdapter(list[FunctionToolParam])


def _nulls(value: Any, path: str = "$") -> list[str]:
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nulls(v, f"{path}[{i}]")]
    return []


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


def _request(t: Thread, **fields: Any) -> PrepareRequest:
    base = {"session_id": t.session_id, "run_id": t.run_id, "instance_id": t.instance_id}
    return PrepareRequest.model_validate({"budget_tokens": 100_000, **base, **fields})


def _bundle(prepared: PreparedContext, records: list[LedgerRecord]) -> ContextBundle:
    failed = {
        r.body.call_id
        for r in records
        if isinstance(r.body, ToolOutcomePayload) and r.body.status is not ToolStatus.SUCCESS
    }
    return ContextBundle(
        messages=prepared.messages,
        tools=tuple(t.function for t in prepared.tools),
        blocks=prepared.blocks,
        error_call_ids=frozenset(failed),
    )


def _tool_groups() -> tuple[PreparedContext, list[LedgerRecord]]:
    """Instructions, a group of two calls answered out of order (one failed), a call without
    text, a plain assistant reply, material, and a follow-up."""
    t = Thread()
    events = [t.system("You are careful."), t.system("Answer in English."), t.user("Why does the test fail?")]
    events += [
        t.assistant("Let me look.", calls=(("a", "bash", {"cmd": "ls"}), ("b", "bash", {"cmd": "pytest"})))
    ]
    events += [
        t.outcome("b", "FAILED test_app.py::test_x - AssertionError", status="error"),
        t.outcome("a", "app.py"),
    ]
    events += [
        t.assistant(calls=(("c", "bash", {"cmd": "cat app.py"}),)),
        t.outcome("c", "def x(): return 1"),
    ]
    events += [t.assistant("x() returns 1, the test expects 2."), t.resource("doc", "style guide")]
    events += [t.child("child says fine"), t.user("Fix it.")]
    records = ledger_records(events)
    req = _request(t, tools=[BASH])
    return assemble_context(_snapshot(t, records), req, resolve_budget(req), COUNTER), records


def _summarized() -> tuple[PreparedContext, list[LedgerRecord]]:
    t = Thread()
    events: list[Any] = [t.system("Sys."), t.user("Fix the failing test")]
    for n in range(3):
        events += [
            t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat log{n}"}),)),
            t.outcome(f"c{n}", f"log {n}"),
        ]
    events += [t.user("and now?")]
    records = ledger_records(events)
    text = "[summary] read logs 0 and 1"
    summary = SummaryView(
        summary_id="sum-1",
        view_revision=1,
        covered_from=1,
        covered_to=6,
        text=text,
        tokens_o200k=COUNTER.count(text),
        tokens_cl100k=counter_for("cl100k_base").count(text),
        sources=tuple(r.seq for r in records if r.seq <= 6),
    )
    req = _request(t, tools=[BASH])
    snapshot = _snapshot(t, records, covered_to=6, summary=summary, view_revision=1)
    prepared = assemble_context(snapshot, req, resolve_budget(req), COUNTER)
    assert any(b.kind.value == "summary" for b in prepared.blocks)
    return prepared, records


def _golden(case: str) -> tuple[PreparedContext, list[LedgerRecord]]:
    data = json.loads((GOLDEN_PREPARE / f"{case}.json").read_text())
    events = [decode_event(json.dumps(e).encode(), max_bytes=1 << 20) for e in data["events"]]
    request = PrepareRequest.model_validate(data["request"])
    first = events[0]
    t = Thread(session_id=first.session_id, run_id=first.run_id, instance_id=first.instance_id)
    records = ledger_records(events, **data.get("limits", {}))
    options = {"allow_drop_history": bool(data.get("options", {}).get("allow_drop_history", False))}
    prepared = assemble_context(_snapshot(t, records), request, resolve_budget(request), COUNTER, **options)
    return prepared, records


def _contexts() -> dict[str, tuple[PreparedContext, list[LedgerRecord]]]:
    return {"tool_groups": _tool_groups(), "summary": _summarized(), **{c: _golden(c) for c in CASES}}


CONTEXTS = _contexts()


# --- Chat Completions: the canonical messages and tools as they go on the wire ---


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_chat_messages_and_tools_are_what_the_sdk_takes_with_no_nulls(name: str) -> None:
    prepared, _ = CONTEXTS[name]
    wire = json.loads(prepared.model_dump_json())
    assert _nulls(wire["messages"]) == [] and _nulls(wire["tools"]) == []
    conforms(CHAT_MESSAGES, wire["messages"])
    conforms(CHAT_TOOLS, wire["tools"])
    assert prepared.openai_messages() == wire["messages"]


def test_a_plain_assistant_message_validates_and_a_null_tool_calls_would_not() -> None:
    prepared, _ = CONTEXTS["tool_groups"]
    plain = [m for m in prepared.openai_messages() if m["role"] == "assistant" and "tool_calls" not in m]
    assert plain == [{"role": "assistant", "content": "x() returns 1, the test expects 2."}]
    conforms(CHAT_MESSAGES, plain)
    with pytest.raises(ValidationError):  # the shape these messages had before nulls were dropped
        CHAT_MESSAGES.validate_python([{**plain[0], "tool_calls": None, "tool_call_id": None}])


def test_chat_tool_calls_are_validated_item_by_item() -> None:
    # The SDK's lazy ``Iterable`` would let a broken call through unread; _conforms reads it.
    broken = [
        {"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "x"}}]}
    ]
    with pytest.raises(ValidationError):
        conforms(CHAT_MESSAGES, broken)


# --- Responses: the adapter's body ---


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_responses_body_is_what_the_sdk_takes_with_no_nulls(name: str) -> None:
    prepared, records = CONTEXTS[name]
    body = responses_request(_bundle(prepared, records))
    assert set(body) <= {"instructions", "input", "tools"} and _nulls(body) == []
    conforms(RESPONSES_INPUT, body["input"])
    conforms(RESPONSES_TOOLS, body["tools"])
    assert body["tools"] == [
        {
            "type": "function",
            "name": t.function.name,
            "description": t.function.description,
            "parameters": t.function.parameters,
            "strict": False,
        }
        for t in prepared.tools
    ]


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_responses_pairs_calls_with_outputs_by_call_id_in_chat_order(name: str) -> None:
    prepared, records = CONTEXTS[name]
    items: list[dict[str, Any]] = responses_request(_bundle(prepared, records))["input"]  # type: ignore[assignment]
    chat_calls = [
        (c.id, c.function.name, c.function.arguments) for m in prepared.messages for c in m.tool_calls or ()
    ]
    chat_outputs = [(m.tool_call_id, m.content) for m in prepared.messages if m.role == "tool"]
    calls = [(i["call_id"], i["name"], i["arguments"]) for i in items if i["type"] == "function_call"]
    outputs = [(i["call_id"], i["output"]) for i in items if i["type"] == "function_call_output"]
    assert calls == chat_calls and outputs == chat_outputs
    position = {i["call_id"]: n for n, i in enumerate(items) if i["type"] == "function_call"}
    for n, item in enumerate(items):
        if item["type"] == "function_call_output":
            assert position[item["call_id"]] < n  # every output follows its own call
    assert sorted(position) == sorted(c for c, _ in outputs)  # and every call has its output
    texts = [(m.role, m.content) for m in prepared.messages if m.role in ("user", "assistant") and m.content]
    assert [(i["role"], i["content"]) for i in items if i["type"] == "message"] == texts


def test_responses_moves_leading_instructions_out_and_keeps_each_call_after_its_text() -> None:
    prepared, records = CONTEXTS["tool_groups"]
    body = responses_request(_bundle(prepared, records))
    assert body["instructions"] == "You are careful.\n\nAnswer in English."
    items: list[dict[str, Any]] = body["input"]  # type: ignore[assignment]
    kinds = [i["type"] if i["type"] != "message" else i["role"] for i in items]
    assert kinds[:8] == [
        "user",
        "assistant",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "function_call",  # a call without text is no empty assistant message
        "function_call_output",
    ]
    failed = next(i for i in items if i.get("call_id") == "b" and i["type"] == "function_call_output")
    assert failed["output"].startswith(
        "[tool status: error]"
    )  # Responses has no error flag: the text says it
    assert json.loads(items[2]["arguments"]) == {"cmd": "ls"}


def test_responses_keeps_a_later_system_message_in_place_as_a_developer_message() -> None:
    bundle = ContextBundle(
        messages=(
            ChatMessage(role="system", content="Rules."),
            ChatMessage(role="user", content="q"),
            ChatMessage(role="system", content="Now be brief."),
            ChatMessage(role="assistant"),
        ),
        tools=(ToolSchema(name="noop"),),
        blocks=(),
    )
    body = responses_request(bundle)
    assert body == {
        "instructions": "Rules.",
        "input": [
            {"type": "message", "role": "user", "content": "q"},
            {"type": "message", "role": "developer", "content": "Now be brief."},
            {"type": "message", "role": "assistant", "content": ""},  # an empty turn stays a turn
        ],
        "tools": [{"type": "function", "name": "noop", "description": "", "parameters": {}, "strict": False}],
    }
    conforms(RESPONSES_INPUT, body["input"])
    conforms(RESPONSES_TOOLS, body["tools"])


def test_responses_without_system_messages_has_no_instructions_key() -> None:
    body = responses_request(
        ContextBundle(messages=(ChatMessage(role="user", content="hi"),), tools=(), blocks=())
    )
    assert body == {"input": [{"type": "message", "role": "user", "content": "hi"}], "tools": []}


@pytest.mark.parametrize("case", CASES)
def test_responses_matches_golden_body(case: str) -> None:
    prepared, records = CONTEXTS[case]
    actual = json.loads(json.dumps(responses_request(_bundle(prepared, records))))
    path = GOLDEN_RESPONSES / f"{case}.json"
    if os.environ.get("CTX_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n")
    assert actual == json.loads(path.read_text())


def test_every_prepare_golden_case_has_a_responses_golden() -> None:
    assert CASES and sorted(p.stem for p in GOLDEN_RESPONSES.glob("*.json")) == CASES
