"""The LangChain v1 middleware end to end: a real agent graph, a scripted chat model, a real fleet."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, convert_to_openai_messages
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from ctxfleet_client import FleetClient
from ctxfleet_client.adapters import FleetConversation
from ctxfleet_client.adapters.langchain import FleetContextMiddleware
from tests.fixtures import agent_script as script

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

GRAPH_THREAD: Any = {"configurable": {"thread_id": "billing"}}
FOLLOW_UP = "And where is it read?"


class ScriptedChatModel(GenericFakeChatModel):
    """Answers from a script, with the usage a provider reports, and keeps every input it was called with."""

    received: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.received.append(list(messages))
        result = super()._generate(messages, *args, **kwargs)
        sent = script.provider_input(convert_to_openai_messages(messages))
        reply = result.generations[0].message
        assert isinstance(reply, AIMessage)
        reply.usage_metadata = {"input_tokens": sent, "output_tokens": 20, "total_tokens": sent + 20}
        return result


@tool
def read_file(path: str) -> str:
    """Read a file of the billing service."""
    return script.read_file(path)


def scripted_replies() -> list[AIMessage]:
    reads = [
        AIMessage(
            content="",
            tool_calls=[{"id": script.call_id(i), "name": "read_file", "args": {"path": script.path_of(i)}}],
        )
        for i in range(script.FILES)
    ]
    return [*reads, AIMessage(content=script.ANSWER)]


async def test_langchain_agent_model_sees_compacted_contexts_while_the_state_keeps_everything(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    reports = await script.calibration_reports(db)
    model = ScriptedChatModel(messages=iter(scripted_replies()))
    conversation = script.conversation(client)
    saver = InMemorySaver()
    agent = create_agent(
        model,
        [read_file],
        system_prompt=script.SYSTEM,
        middleware=[FleetContextMiddleware(conversation)],
        checkpointer=saver,
    )

    state = await agent.ainvoke({"messages": [{"role": "user", "content": script.TASK}]}, GRAPH_THREAD)

    assert len(model.received) == script.FILES + 1
    for received in model.received:
        script.assert_compacted_context(convert_to_openai_messages(received))
    last = convert_to_openai_messages(model.received[-1])
    assert script.tokens(last) < script.unmanaged_tokens(script.FILES) - script.BUDGET // 2
    # The graph's state keeps every message; the ledger holds the same conversation, in order.
    messages = state["messages"]
    assert len(messages) == 2 + 2 * script.FILES and messages[-1].content == script.ANSWER
    await script.assert_ledger_holds(client, conversation.thread_id)
    # The usage each reply reported came back with the next prepare and calibrated the profile.
    assert await script.calibration_reports(db) > reports


async def test_langchain_graph_resumed_in_another_process_records_nothing_twice(
    fleet, client: FleetClient
) -> None:
    first_process, saver = script.conversation(client), InMemorySaver()

    def agent_of(model: ScriptedChatModel, conversation: FleetConversation) -> Any:
        middleware = [FleetContextMiddleware(conversation)]
        return create_agent(
            model, [read_file], system_prompt=script.SYSTEM, middleware=middleware, checkpointer=saver
        )

    first = ScriptedChatModel(messages=iter(scripted_replies()))
    await agent_of(first, first_process).ainvoke(
        {"messages": [{"role": "user", "content": script.TASK}]}, GRAPH_THREAD
    )
    # A new middleware (as after a restart) over the checkpointed graph: it republishes the history
    # it does not know to be recorded, under the same keys and bodies, then the new turns.
    resumed = ScriptedChatModel(messages=iter([AIMessage(content="billing/retry.py reads it.")]))
    state = await agent_of(resumed, script.conversation(client, like=first_process)).ainvoke(
        {"messages": [{"role": "user", "content": FOLLOW_UP}]}, GRAPH_THREAD
    )

    assert len(state["messages"]) == 2 + 2 * script.FILES + 2
    (received,) = resumed.received
    script.assert_compacted_context(convert_to_openai_messages(received))
    assert convert_to_openai_messages(received)[-1] == {"role": "user", "content": FOLLOW_UP}
    then = ("user_input", "assistant_message")
    await script.assert_ledger_holds(client, first_process.thread_id, then=then)


async def test_langchain_middleware_records_each_graph_thread_in_its_own_fleet_thread(
    fleet, client: FleetClient
) -> None:
    conversations: dict[str, FleetConversation] = {}

    def conversation_of(graph_thread: str) -> FleetConversation:
        conversations[graph_thread] = script.conversation(client)
        return conversations[graph_thread]

    follow_up = AIMessage(content="billing/retry.py reads it.")
    model = ScriptedChatModel(messages=iter([*scripted_replies(), *scripted_replies(), follow_up]))
    agent = create_agent(
        model,
        [read_file],
        system_prompt=script.SYSTEM,
        middleware=[FleetContextMiddleware(conversation_of)],
        checkpointer=InMemorySaver(),
    )
    task = {"messages": [{"role": "user", "content": script.TASK}]}
    await agent.ainvoke(task, {"configurable": {"thread_id": "first"}})
    await agent.ainvoke(task, {"configurable": {"thread_id": "second"}})
    # The first graph thread goes on after its own turns, not after the second's.
    await agent.ainvoke(
        {"messages": [{"role": "user", "content": FOLLOW_UP}]}, {"configurable": {"thread_id": "first"}}
    )

    assert sorted(conversations) == ["first", "second"]
    for received in model.received:
        script.assert_compacted_context(convert_to_openai_messages(received))
    assert convert_to_openai_messages(model.received[-1])[-1] == {"role": "user", "content": FOLLOW_UP}
    then = ("user_input", "assistant_message")
    await script.assert_ledger_holds(client, conversations["first"].thread_id, then=then)
    await script.assert_ledger_holds(client, conversations["second"].thread_id)
