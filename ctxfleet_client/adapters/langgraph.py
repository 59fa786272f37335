"""LangGraph's prebuilt agent pre-model hook: the model sees the fleet's prepared context.

::

    hook = FleetPreModelHook(FleetConversation(fleet, session_id=s, run_id=r, budget_tokens=8_000), tools)
    agent = create_react_agent(model, tools, pre_model_hook=hook.prepare, checkpointer=saver)
    state = await agent.ainvoke({"messages": [("system", prompt), ("user", task)]}, config)
    await hook.record(state)  # the run's last reply, before the next run

Before each model call the hook records the state's messages that are new (keyed by position, as
the LangChain middleware does) and answers the prepared context as ``llm_input_messages``: the model
sees it, the graph's state keeps every message. A hook runs before the model only, so a reply is
recorded by the next call's hook, and the run's last one by ``record``. The system prompt is recorded
and budgeted when it is the state's first message; one given as the agent's ``prompt`` is added after
the hook, outside the budget. Prebuilt agents only; for ``create_agent`` use the middleware.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.tools import BaseTool

from contracts import ToolSchema

from .conversation import FleetConversation
from .langchain import from_prepared, tool_schema, to_turn

__all__ = ["FleetPreModelHook"]


class FleetPreModelHook:
    """Record the graph's conversation and prepare each model call's input from the fleet."""

    def __init__(
        self, conversation: FleetConversation, tools: Sequence[BaseTool | dict[str, Any]] = ()
    ) -> None:
        """Serve one conversation; ``tools`` are the agent's, counted against the budget."""
        self.conversation = conversation
        self.tools: tuple[ToolSchema, ...] = tuple(tool_schema(t) for t in tools)

    async def prepare(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The pre-model hook: record what is new, answer the prepared context as the model's input."""
        await self.record(state)
        system, messages = from_prepared(await self.conversation.prepare(self.tools))
        return {"llm_input_messages": [*([system] if system is not None else []), *messages]}

    async def record(self, state: Mapping[str, Any]) -> None:
        """Record the state's messages this process has not recorded yet."""
        await self.conversation.record([to_turn(m) for m in state["messages"]])
