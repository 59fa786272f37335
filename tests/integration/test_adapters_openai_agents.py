"""The Agents SDK session end to end: a real ``Runner``, a scripted ``Model``, a real fleet."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from ctxfleet_client import FleetClient
from ctxfleet_client.adapters.openai_agents import FleetSession
from tests.fixtures import agent_script as script

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

FOLLOW_UP = "And where is it read?"


class ScriptedModel(Model):
    """Reads the script's files one call per response, then answers; keeps every input it was sent."""

    def __init__(self) -> None:
        self.received: list[list[dict[str, Any]]] = []
        self.answer_at = script.FILES

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.received.append([dict(item) for item in input])
        step = len(self.received) - 1
        if step < self.answer_at:
            arguments = json.dumps({"path": script.path_of(step)})
            output: Any = ResponseFunctionToolCall(
                type="function_call", call_id=script.call_id(step), name="read_file", arguments=arguments
            )
        else:
            text = ResponseOutputText(type="output_text", text=script.ANSWER, annotations=[])
            output = ResponseOutputMessage(
                id="msg_answer", type="message", role="assistant", status="completed", content=[text]
            )
        sent = script.provider_input(_chat(self.received[-1]))
        usage = Usage(requests=1, input_tokens=sent, output_tokens=20, total_tokens=sent + 20)
        return ModelResponse(output=[output], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the script answers whole responses")


def _chat(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items in Chat wire shape, for the script's checks."""
    chat: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if chat and chat[-1]["role"] == "assistant":
                chat[-1].setdefault("tool_calls", []).append(call)
            else:
                chat.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            chat.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        else:
            role = "system" if item["role"] == "developer" else item["role"]
            chat.append({"role": role, "content": item["content"]})
    return chat


@function_tool
def read_file(path: str) -> str:
    """Read a file of the billing service."""
    return script.read_file(path)


async def test_agents_sdk_runner_sees_compacted_contexts_and_the_ledger_keeps_everything(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    model = ScriptedModel()
    conversation = script.conversation(client)
    session = FleetSession(conversation)
    agent = Agent(name="billing", instructions=script.SYSTEM, model=model, tools=[read_file])
    config = RunConfig(tracing_disabled=True, call_model_input_filter=session.model_input)
    reports = await script.calibration_reports(db)

    result = await Runner.run(agent, script.TASK, session=session, run_config=config, hooks=session.hooks)

    assert result.final_output == script.ANSWER and len(model.received) == script.FILES + 1
    for items in model.received:
        script.assert_compacted_context(_chat(items))
    assert (
        script.tokens(_chat(model.received[-1])) < script.unmanaged_tokens(script.FILES) - script.BUDGET // 2
    )
    await script.assert_ledger_holds(client, conversation.thread_id, system=False)
    # The usage each response reported came back with the next prepare and calibrated the profile.
    assert await script.calibration_reports(db) > reports


async def test_agents_sdk_session_in_a_new_process_continues_after_the_recorded_items(
    fleet, client: FleetClient
) -> None:
    first_process = script.conversation(client)
    agent = Agent(name="billing", instructions=script.SYSTEM, model=ScriptedModel(), tools=[read_file])
    session = FleetSession(first_process)
    config = RunConfig(tracing_disabled=True, call_model_input_filter=session.model_input)
    await Runner.run(agent, script.TASK, session=session, run_config=config)
    await script.assert_ledger_holds(client, first_process.thread_id, system=False)

    # Another process builds the session again: it starts from the prepared context, and its items
    # are recorded after the ones the ledger holds.
    model = ScriptedModel()
    model.answer_at = 0
    session = FleetSession(script.conversation(client, like=first_process))
    agent = Agent(name="billing", instructions=script.SYSTEM, model=model, tools=[read_file])
    config = RunConfig(tracing_disabled=True, call_model_input_filter=session.model_input)
    await Runner.run(agent, FOLLOW_UP, session=session, run_config=config)

    (received,) = model.received
    script.assert_compacted_context(_chat(received))
    assert _chat(received)[-1] == {"role": "user", "content": FOLLOW_UP}
    then = ("user_input", "assistant_message")
    await script.assert_ledger_holds(client, first_process.thread_id, system=False, then=then)


async def test_agents_sdk_cleared_session_starts_the_context_over_and_the_ledger_keeps_the_past(
    fleet, client: FleetClient
) -> None:
    conversation = script.conversation(client)
    session = FleetSession(conversation)
    await session.add_items([{"role": "user", "content": script.TASK}])
    await session.clear_session()
    await session.add_items([{"role": "user", "content": FOLLOW_UP}])

    assert await session.get_items() == [{"type": "message", "role": "user", "content": FOLLOW_UP}]
    assert await session.pop_item() is None
    records = (await client.inspect(conversation.thread_id, limit=10)).records
    assert sorted((r.event_key, r.kind) for r in records) == [
        ("m0", "user_input"),
        ("m1", "context_reset"),
        ("m2", "user_input"),
    ]
