"""What each framework adapter records for a framework's messages: one turn per model reply or tool result."""

from __future__ import annotations

from langchain_core.messages import AIMessage, ToolMessage

from contracts import AssistantMessagePayload, ToolCall, ToolOutcomePayload, ToolStatus, UserInputPayload
from ctxfleet_client.adapters import langchain, openai_agents


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
