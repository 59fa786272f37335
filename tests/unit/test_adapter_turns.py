"""What each framework adapter records for a framework's messages: one turn per model reply or tool result."""

from __future__ import annotations

from langchain_core.messages import AIMessage, ToolMessage
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.usage import RequestUsage

from contracts import AssistantMessagePayload, ToolCall, ToolOutcomePayload, ToolStatus, UserInputPayload
from contracts.task_budgets import CallUsage
from ctxfleet_client.adapters import langchain, openai_agents, pydantic_ai


def test_agents_sdk_items_of_one_response_are_one_assistant_turn() -> None:
    items = [
        {"role": "user", "content": "Read both files."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": '{"path": "a"}'},
        {"type": "function_call", "call_id": "c2", "name": "read", "arguments": '{"path": "b"}'},
        {"type": "reasoning", "id": "r1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "A"},
        {"type": "function_call_output", "call_id": "c2", "output": "B"},
    ]
    calls = (
        ToolCall(call_id="c1", name="read", args={"path": "a"}),
        ToolCall(call_id="c2", name="read", args={"path": "b"}),
    )
    assert openai_agents.to_turns(items) == [  # type: ignore[arg-type]
        UserInputPayload(text="Read both files."),
        AssistantMessagePayload(text="Reading.", tool_calls=calls),
        ToolOutcomePayload(call_id="c1", text="A"),
        ToolOutcomePayload(call_id="c2", text="B"),
    ]


def test_langchain_messages_keep_their_calls_and_a_failed_tool_result() -> None:
    reply = AIMessage(content="", tool_calls=[{"id": "c1", "name": "read", "args": {"path": "a"}}])
    failed = ToolMessage(content="no such file", tool_call_id="c1", status="error")
    assert [langchain.to_turn(reply), langchain.to_turn(failed)] == [
        AssistantMessagePayload(tool_calls=(ToolCall(call_id="c1", name="read", args={"path": "a"}),)),
        ToolOutcomePayload(call_id="c1", status=ToolStatus.ERROR, text="no such file"),
    ]


def test_replies_keep_the_usage_their_framework_reports_and_none_when_it_reports_none() -> None:
    usage = {"input_tokens": 1_200, "output_tokens": 30, "total_tokens": 1_230}
    assert langchain.to_turn(AIMessage(content="done", usage_metadata=usage)) == AssistantMessagePayload(
        text="done", usage=CallUsage(input_tokens=1_200, output_tokens=30)
    )
    assert langchain.to_turn(AIMessage(content="done")) == AssistantMessagePayload(text="done")
    reported = ModelResponse(parts=[TextPart("done")], usage=RequestUsage(input_tokens=900, output_tokens=12))
    assert pydantic_ai.to_turns(reported)[0] == AssistantMessagePayload(
        text="done", usage=CallUsage(input_tokens=900, output_tokens=12)
    )
    # Pydantic AI's response without a report carries zeros, which is no usage.
    unreported = ModelResponse(parts=[TextPart("done")])
    assert pydantic_ai.to_turns(unreported) == [AssistantMessagePayload(text="done")]
