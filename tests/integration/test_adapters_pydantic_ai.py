"""The Pydantic AI history processor end to end: a real agent, a scripted ``FunctionModel``, a real fleet."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from ctxfleet_client import FleetClient
from ctxfleet_client.adapters.pydantic_ai import FleetHistory
from tests.fixtures import agent_script as script

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


def _chat(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """What the model received, in Chat wire shape, for the script's checks."""
    chat: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            calls = [
                {
                    "id": p.tool_call_id,
                    "type": "function",
                    "function": {"name": p.tool_name, "arguments": p.args_as_json_str()},
                }
                for p in message.parts
                if isinstance(p, ToolCallPart)
            ]
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            chat.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
            continue
        for part in message.parts:
            if isinstance(part, SystemPromptPart):
                chat.append({"role": "system", "content": part.content})
            elif isinstance(part, UserPromptPart):
                chat.append({"role": "user", "content": part.content})
            elif isinstance(part, ToolReturnPart):
                chat.append(
                    {"role": "tool", "tool_call_id": part.tool_call_id, "content": part.model_response_str()}
                )
    return chat


async def test_pydantic_ai_agent_model_sees_compacted_contexts_and_the_ledger_keeps_everything(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    received: list[list[ModelMessage]] = []
    reports = await script.calibration_reports(db)

    def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        received.append(messages)
        step = len(received) - 1
        usage = RequestUsage(input_tokens=script.provider_input(_chat(messages)), output_tokens=20)
        if step < script.FILES:
            args = json.dumps({"path": script.path_of(step)})
            call = ToolCallPart("read_file", args, tool_call_id=script.call_id(step))
            return ModelResponse(parts=[call], usage=usage)
        return ModelResponse(parts=[TextPart(script.ANSWER)], usage=usage)

    conversation = script.conversation(client)
    history = FleetHistory(conversation)
    agent = Agent(
        FunctionModel(scripted), system_prompt=script.SYSTEM, capabilities=[ProcessHistory(history.process)]
    )

    @agent.tool_plain
    def read_file(path: str) -> str:
        """Read a file of the billing service."""
        return script.read_file(path)

    result = await agent.run(script.TASK)
    await history.record(result.all_messages())

    assert result.output == script.ANSWER and len(received) == script.FILES + 1
    for messages in received:
        script.assert_compacted_context(_chat(messages))
    assert script.tokens(_chat(received[-1])) < script.unmanaged_tokens(script.FILES) - script.BUDGET // 2
    await script.assert_ledger_holds(client, conversation.thread_id)
    # The usage each reply reported came back with the next prepare and calibrated the profile.
    assert await script.calibration_reports(db) > reports
    # The run's history handed to another process records nothing twice: same keys, same bodies.
    again = script.conversation(client, like=conversation)
    await FleetHistory(again).record(result.all_messages())
    await again.prepare()  # names the republished turn: a key holding another body is refused here
    await script.assert_ledger_holds(client, conversation.thread_id)
