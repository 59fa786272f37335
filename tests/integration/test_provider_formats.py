"""A prepare answers in the provider's own request shape, over real servers."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import MessageParam, TextBlockParam, ToolParam
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from openai.types.responses import FunctionToolParam, ResponseInputParam
from pydantic import TypeAdapter

from contracts import ToolSchema
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread, prepare_request
from tests.fixtures.sdk import conforms

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

BASH = ToolSchema(name="bash", description="Run a shell command", parameters={"type": "object"})


async def _coding_turn(client: FleetClient, t: Thread) -> None:
    await client.append(t.system("You fix bugs."))
    await client.append(t.user("Fix the failing parser test."))
    await client.append(
        t.assistant(
            "Looking.", calls=(("c1", "bash", {"cmd": "pytest -x"}), ("c2", "bash", {"cmd": "cat parser.py"}))
        )
    )
    await client.append(t.outcome("c2", "def parse(): ..."))
    await client.append(t.outcome("c1", "E AssertionError", status="error", key="last"))


async def test_one_context_comes_back_in_each_providers_shape_with_the_same_id_and_blocks(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await _coding_turn(client, t)
    shapes = {
        f: await client.prepare(prepare_request(t, after_event_key="last", tools=(BASH,), format=f))
        for f in ("openai.chat", "openai.responses", "anthropic.messages")
    }
    chat = shapes["openai.chat"]
    assert chat.request is None
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(chat.openai_messages())
    TypeAdapter(list[ChatCompletionToolParam]).validate_python(
        [t.model_dump(mode="json") for t in chat.tools]
    )
    # The shape changes, never the context: same id, blocks and budget report.
    for prepared in shapes.values():
        assert prepared.prepared_id == chat.prepared_id and prepared.blocks == chat.blocks
        assert prepared.budget_report == chat.budget_report

    responses = shapes["openai.responses"].request
    assert responses is not None and responses["instructions"] == "You fix bugs."
    conforms(TypeAdapter(ResponseInputParam), responses["input"])
    items: list[Any] = responses["input"]  # type: ignore[assignment]
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert calls == outputs == ["c1", "c2"]
    conforms(TypeAdapter(list[FunctionToolParam]), responses["tools"])

    anthropic = shapes["anthropic.messages"].request
    assert anthropic is not None
    conforms(TypeAdapter(list[TextBlockParam]), anthropic["system"])
    conforms(TypeAdapter(list[MessageParam]), anthropic["messages"])
    messages: list[Any] = anthropic["messages"]  # type: ignore[assignment]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    results = [b for b in messages[-1]["content"] if b["type"] == "tool_result"]
    assert [(r["tool_use_id"], r.get("is_error", False)) for r in results] == [("c1", True), ("c2", False)]
    conforms(TypeAdapter(list[ToolParam]), anthropic["tools"])
