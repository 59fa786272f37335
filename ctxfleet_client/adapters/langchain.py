"""LangChain v1 agent middleware: the model sees the fleet's prepared context, the graph keeps it all.

::

    def conversation(graph_thread: str) -> FleetConversation:
        return FleetConversation(fleet, session_id=s, run_id=graph_thread, budget_tokens=8_000)

    agent = create_agent(model, tools, middleware=[FleetContextMiddleware(conversation)], checkpointer=saver)
    await agent.ainvoke({"messages": [("user", task)]}, {"configurable": {"thread_id": "t-1"}})

Around each model call it records the messages of the agent's state that are new (the system prompt
first, then the state's messages, keyed by position), asks the fleet for the context, and calls the
model with it; the model's reply is recorded as it joins the state. The graph's state is left as it
is: a checkpointer still holds every message, and the fleet's ledger holds the same conversation.
Async agents only (``ainvoke``, ``astream``): recording and preparing are network calls.

One middleware serves every thread of the graph: it asks ``conversation`` for the fleet conversation
of each graph thread (``configurable.thread_id``) the first time it sees it, and keeps it for the
thread's next calls. Given one ``FleetConversation`` instead, it serves that conversation alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.runtime import Runtime

from contracts import (
    AssistantMessagePayload,
    ChatMessage,
    PreparedContext,
    SystemPayload,
    ToolCall,
    ToolOutcomePayload,
    ToolSchema,
    ToolStatus,
    UserInputPayload,
)
from contracts.task_budgets import CallUsage
from contracts.exceptions import InvalidRequest

from .conversation import FleetConversation, Turn, call_arguments

__all__ = ["ConversationOf", "FleetContextMiddleware", "from_prepared", "to_turn", "tool_schema"]

# The fleet conversation of a graph thread, from the thread's ``configurable.thread_id``.
ConversationOf: TypeAlias = Callable[[str], FleetConversation]


class FleetContextMiddleware(AgentMiddleware[Any, Any, Any]):
    """Prepare every model call's messages from the fleet; record the conversation as it grows."""

    def __init__(self, conversation: FleetConversation | ConversationOf) -> None:
        """Serve the fleet conversation of each graph thread, or one conversation for every call."""
        super().__init__()
        self._conversation_of = conversation
        # Each graph thread's conversation knows which of its turns this process has recorded.
        self._conversations: dict[str, FleetConversation] = {}

    def conversation(self, runtime: Runtime[Any] | None) -> FleetConversation:
        """The fleet conversation of the graph thread ``runtime`` runs."""
        if isinstance(self._conversation_of, FleetConversation):
            return self._conversation_of
        info = runtime.execution_info if runtime is not None else None
        if info is None or info.thread_id is None:
            raise InvalidRequest(
                "a middleware serving many graph threads needs the run's configurable thread_id "
                "(and a checkpointer)"
            )
        thread_id = info.thread_id
        if thread_id not in self._conversations:
            self._conversations[thread_id] = self._conversation_of(thread_id)
        return self._conversations[thread_id]

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """Record what is new, call the model with the prepared context, record its reply."""
        system = [request.system_message] if request.system_message is not None else []
        history = [to_turn(m) for m in (*system, *request.state["messages"])]
        conversation = self.conversation(request.runtime)
        await conversation.record(history)
        prepared = await conversation.prepare([tool_schema(t) for t in request.tools])
        system_message, messages = from_prepared(prepared)
        response = await handler(request.override(system_message=system_message, messages=messages))
        await conversation.record([*history, *(to_turn(m) for m in response.result)])
        return response


def to_turn(message: BaseMessage) -> Turn:
    """A LangChain message as the turn the fleet records."""
    match message:
        case SystemMessage():
            return SystemPayload(text=message.text)
        case HumanMessage():
            return UserInputPayload(text=message.text)
        case AIMessage():
            calls = tuple(
                ToolCall(call_id=c["id"] or "", name=c["name"], args=c["args"]) for c in message.tool_calls
            )
            usage = message.usage_metadata
            reported = (
                CallUsage(input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"])
                if usage
                else None
            )
            return AssistantMessagePayload(text=message.text, tool_calls=calls, usage=reported)
        case ToolMessage():
            status = ToolStatus.ERROR if message.status == "error" else ToolStatus.SUCCESS
            return ToolOutcomePayload(call_id=message.tool_call_id, status=status, text=message.text)
    raise InvalidRequest(f"a {type(message).__name__} is not a message the fleet records")


def from_prepared(prepared: PreparedContext) -> tuple[SystemMessage | None, list[AnyMessage]]:
    """The prepared context as a model request's system message and messages."""
    system = [m.content or "" for m in prepared.messages if m.role == "system"]
    rest = [_message(m) for m in prepared.messages if m.role != "system"]
    return (SystemMessage(content="\n\n".join(system)) if system else None), rest


def _message(message: ChatMessage) -> AnyMessage:
    match message.role:
        case "user":
            return HumanMessage(content=message.content or "")
        case "assistant":
            calls = [
                {"id": c.id, "name": c.function.name, "args": call_arguments(c.function.arguments)}
                for c in message.tool_calls or ()
            ]
            return AIMessage(content=message.content or "", tool_calls=calls)
        case "tool":
            return ToolMessage(content=message.content or "", tool_call_id=message.tool_call_id or "")
        case "system":
            return SystemMessage(content=message.content or "")


def tool_schema(tool: BaseTool | dict[str, Any]) -> ToolSchema:
    """A tool as the budget counts it: its name, description and JSON Schema parameters."""
    function = convert_to_openai_tool(tool)["function"]
    return ToolSchema(
        name=function["name"],
        description=function.get("description", ""),
        parameters=function.get("parameters", {}),
    )
