"""LangGraph's prebuilt agent with the pre-model hook end to end: a scripted chat model, a real fleet."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from langchain_core.messages import convert_to_openai_messages
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import create_react_agent

from ctxfleet_client import FleetClient
from ctxfleet_client.adapters.langgraph import FleetPreModelHook
from tests.fixtures import agent_script as script
from tests.integration.test_adapters_langchain import ScriptedChatModel, read_file, scripted_replies

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.pg,
    pytest.mark.nats,
    # The prebuilt agent is deprecated for ``create_agent``, and still the one with a pre-model hook.
    pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecationWarning"),
]

GRAPH_THREAD: Any = {"configurable": {"thread_id": "billing"}}


async def test_prebuilt_agent_model_sees_compacted_contexts_while_the_state_keeps_everything(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    model = ScriptedChatModel(messages=iter(scripted_replies()))
    conversation = script.conversation(client)
    hook = FleetPreModelHook(conversation, [read_file])
    agent = create_react_agent(model, [read_file], pre_model_hook=hook.prepare, checkpointer=InMemorySaver())
    reports = await script.calibration_reports(db)

    task = [{"role": "system", "content": script.SYSTEM}, {"role": "user", "content": script.TASK}]
    state = await agent.ainvoke({"messages": task}, GRAPH_THREAD)
    await hook.record(state)

    assert len(model.received) == script.FILES + 1
    for received in model.received:
        script.assert_compacted_context(convert_to_openai_messages(received))
    last = convert_to_openai_messages(model.received[-1])
    assert script.tokens(last) < script.unmanaged_tokens(script.FILES) - script.BUDGET // 2
    # The graph's state keeps every message; the ledger holds the same conversation, in order.
    messages = state["messages"]
    assert len(messages) == 3 + 2 * script.FILES and messages[-1].content == script.ANSWER
    await script.assert_ledger_holds(client, conversation.thread_id)
    # The usage each reply reported came back with the next prepare and calibrated the profile.
    assert await script.calibration_reports(db) > reports
