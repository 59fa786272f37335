"""An OpenAI Agents SDK ``Session`` backed by the fleet: items recorded as events, history prepared.

::

    session = FleetSession(FleetConversation(fleet, session_id=s, run_id=r, budget_tokens=8_000))
    config = RunConfig(call_model_input_filter=session.model_input)  # every call, not only the first
    result = await Runner.run(agent, task, session=session, run_config=config, hooks=session.hooks)

``add_items`` records the items the SDK saves, in order: an assistant message and the function
calls of the same response are one turn, as the fleet records a model reply. ``get_items`` answers
the prepared context's items in Responses shape, within the budget, so the history a run starts
from is already compacted. The SDK reads a session once per run and keeps the run's own items in
memory; ``model_input`` prepares the context again before each model call of the run, from what
the SDK saved after each turn. The ledger is append-only: ``pop_item`` removes nothing (it answers
``None``), and ``clear_session`` records a context reset, after which the context starts over.
The SDK saves items without the usage of the response that produced them: ``hooks`` (the run's
``RunHooks``) keeps each response's usage, which is recorded with its items and calibrates the fleet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agents import Agent, ModelResponse, RunContextWrapper, RunHooks
from agents.run_config import CallModelData, ModelInputData

from contracts import (
    AssistantMessagePayload,
    ContextResetPayload,
    SystemPayload,
    ToolCall,
    ToolOutcomePayload,
    UserInputPayload,
)
from contracts.task_budgets import CallUsage

from .conversation import FleetConversation, Turn, call_arguments

if TYPE_CHECKING:
    from agents import TResponseInputItem

__all__ = ["FleetSession", "ResponseUsage", "to_turns"]


class FleetSession:
    """The Agents SDK's session protocol over one fleet thread."""

    session_settings = None

    def __init__(self, conversation: FleetConversation) -> None:
        """Serve one conversation; the SDK's ``session_id`` is the fleet's thread id."""
        self.conversation = conversation
        self.session_id = conversation.thread_id
        self.hooks = ResponseUsage()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The prepared context's items (the latest ``limit`` of them when given)."""
        await self.conversation.resume()
        if not self.conversation.recorded:
            return []
        prepared = await self.conversation.prepare(format="openai.responses")
        body = prepared.request or {}
        instructions = body.get("instructions")
        items: list[Any] = list(body.get("input") or [])  # type: ignore[arg-type]
        if isinstance(instructions, str) and instructions:
            items.insert(0, {"type": "message", "role": "developer", "content": instructions})
        return items[-limit:] if limit else items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Record the items, in order; a response's turn with the usage ``hooks`` kept for it."""
        turns = to_turns(items)
        replies = [i for i, t in enumerate(turns) if isinstance(t, AssistantMessagePayload)]
        usage = self.hooks.take()
        if replies and usage is not None:
            reply = turns[replies[-1]]
            assert isinstance(reply, AssistantMessagePayload)
            turns[replies[-1]] = reply.model_copy(update={"usage": usage})
        await self.conversation.extend(turns)

    async def pop_item(self) -> TResponseInputItem | None:
        """Nothing: a recorded event is never removed from the ledger."""
        return None

    async def clear_session(self) -> None:
        """Start the context over; the ledger keeps what came before."""
        await self.conversation.extend([ContextResetPayload(reason="the session was cleared")])

    async def model_input(self, data: CallModelData[Any]) -> ModelInputData:
        """A ``call_model_input_filter``: the prepared context before every model call of a run."""
        return ModelInputData(input=await self.get_items(), instructions=data.model_data.instructions)


class ResponseUsage(RunHooks[Any]):
    """Run hooks that keep the usage of the model's last response until its items are saved."""

    def __init__(self) -> None:
        """Nothing reported yet."""
        self.usage: CallUsage | None = None

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        """Keep the response's usage (a response reported without input tokens keeps none)."""
        usage = response.usage
        self.usage = (
            CallUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
            if usage.input_tokens
            else None
        )

    def take(self) -> CallUsage | None:
        """The kept usage, once."""
        usage, self.usage = self.usage, None
        return usage


def to_turns(items: Iterable[TResponseInputItem]) -> list[Turn]:
    """Responses items as the turns the fleet records; a response's message and calls are one turn."""
    turns: list[Turn] = []
    for raw in items:
        item: dict[str, Any] = dict(raw)
        kind, role = item.get("type", "message"), item.get("role")
        last = turns[-1] if turns else None
        if kind == "function_call":
            call = ToolCall(
                call_id=item["call_id"], name=item["name"], args=call_arguments(item["arguments"])
            )
            if isinstance(last, AssistantMessagePayload):
                turns[-1] = last.model_copy(update={"tool_calls": (*last.tool_calls, call)})
            else:
                turns.append(AssistantMessagePayload(tool_calls=(call,)))
        elif kind == "function_call_output":
            turns.append(ToolOutcomePayload(call_id=item["call_id"], text=_text(item.get("output"))))
        elif kind == "message" and role == "assistant":
            turns.append(AssistantMessagePayload(text=_text(item.get("content"))))
        elif kind == "message" and role in ("system", "developer"):
            turns.append(SystemPayload(text=_text(item.get("content"))))
        elif kind == "message" and role == "user":
            turns.append(UserInputPayload(text=_text(item.get("content"))))
        # Reasoning and hosted-tool items carry nothing the fleet assembles into a context.
    return turns


def _text(content: Any) -> str:
    """The text of an item's content: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content)
