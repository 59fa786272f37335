"""The LangChain v1 middleware end to end: a real agent graph, a scripted chat model, a real fleet."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages
from langchain_core.tools import tool
from pydantic import Field

from ctxfleet_client import FleetClient
from ctxfleet_client.adapters import FleetConversation
from ctxfleet_client.adapters.langchain import FleetContextMiddleware
from tests.fixtures import agent_script as script

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


class ScriptedChatModel(GenericFakeChatModel):
    """Answers from a script and keeps every input it was called with."""

    received: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.received.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


@tool
def read_file(path: str) -> str:
    """Read a file of the billing service."""
    return script.read_file(path)


def _script() -> list[AIMessage]:
    reads = [
        AIMessage(
            content="",
            tool_calls=[{"id": script.call_id(i), "name": "read_file", "args": {"path": script.path_of(i)}}],
        )
        for i in range(script.FILES)
    ]
    return [*reads, AIMessage(content=script.ANSWER)]


async def test_langchain_agent_model_sees_compacted_contexts_while_the_state_keeps_everything(
    fleet, client: FleetClient
) -> None:
    model = ScriptedChatModel(messages=iter(_script()))
    conversation = FleetConversation(
        client, session_id=f"s-{uuid.uuid4().hex[:10]}", run_id="r-1", budget_tokens=script.BUDGET
    )
    agent = create_agent(
        model, [read_file], system_prompt=script.SYSTEM, middleware=[FleetContextMiddleware(conversation)]
    )

    state = await agent.ainvoke({"messages": [{"role": "user", "content": script.TASK}]})

    assert len(model.received) == script.FILES + 1
    for received in model.received:
        script.assert_compacted_context(convert_to_openai_messages(received))
    last = convert_to_openai_messages(model.received[-1])
    assert script.tokens(last) < script.unmanaged_tokens(script.FILES) - script.BUDGET // 2
    # The graph's state keeps every message; the ledger holds the same conversation, in order.
    messages = state["messages"]
    assert len(messages) == 2 + 2 * script.FILES and messages[-1].content == script.ANSWER
    await script.assert_ledger_holds(client, conversation.thread_id)
