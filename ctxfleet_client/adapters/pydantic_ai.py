"""A Pydantic AI history processor: each model request gets the fleet's prepared context.

::

    history = FleetHistory(FleetConversation(fleet, session_id=s, run_id=r, budget_tokens=8_000))
    agent = Agent(model, capabilities=[ProcessHistory(history.process)])
    result = await agent.run(task)
    await history.record(result.all_messages())  # the run's last reply, before the next run

Pydantic AI keeps what a processor returns as the run's history, so from the first step on its
history is the fleet's context (marked in each message's ``metadata``, which is never sent to a
model) followed by the messages the run added since. Those are the new turns: the mark says how many
turns the thread held when the context was prepared, so each new turn's key is its position in the
whole conversation, and a history handed back to a later run records nothing twice. The ledger
holds the whole conversation; ``result.all_messages()`` holds the last context and what followed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from contracts import (
    AssistantMessagePayload,
    ChatMessage,
    PreparedContext,
    SystemPayload,
    ToolCall,
    ToolOutcomePayload,
    ToolStatus,
    UserInputPayload,
)
from contracts.task_budgets import CallUsage

from .conversation import FleetConversation, Turn, call_arguments, tool_names

__all__ = ["MARK", "FleetHistory", "from_prepared", "to_turns"]

# The metadata key of a message the fleet prepared: the number of turns the thread held then.
MARK = "ctxfleet_recorded"


class FleetHistory:
    """Replace a run's history by the fleet's context before each model request."""

    def __init__(self, conversation: FleetConversation) -> None:
        """Serve one conversation: the agent's thread in the fleet."""
        self.conversation = conversation

    async def process(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The history processor: record the new turns, answer the prepared context."""
        await self.record(messages)
        prepared = await self.conversation.prepare()
        context = from_prepared(prepared, mark=self.conversation.recorded)
        instructions = next((m.instructions for m in reversed(messages) if isinstance(m, ModelRequest)), None)
        last = context[-1]
        if instructions is not None and isinstance(last, ModelRequest):
            last.instructions = instructions
        return context

    async def record(self, messages: Sequence[ModelMessage]) -> None:
        """Record the turns of ``messages`` that follow the last context the fleet prepared."""
        start, new = 0, list(messages)
        for i, message in enumerate(messages):
            if message.metadata is not None and MARK in message.metadata:
                start, new = int(message.metadata[MARK]), list(messages[i + 1 :])
        await self.conversation.record([t for m in new for t in to_turns(m)], start=start)


def to_turns(message: ModelMessage) -> list[Turn]:
    """A Pydantic AI message as the turns the fleet records (a request's parts are one turn each)."""
    if isinstance(message, ModelResponse):
        text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
        calls = tuple(
            ToolCall(call_id=p.tool_call_id, name=p.tool_name, args=p.args_as_dict())
            for p in message.parts
            if isinstance(p, ToolCallPart)
        )
        usage = message.usage
        # A response the provider reported no usage for carries zeros.
        reported = (
            CallUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
            if usage.input_tokens
            else None
        )
        return [AssistantMessagePayload(text=text, tool_calls=calls, usage=reported)]
    return [t for p in message.parts if (t := _request_turn(p)) is not None]


def _request_turn(part: ModelRequestPart) -> Turn | None:
    """The turn of one request part; parts with no text for a model (files, speech, …) record none."""
    match part:
        case SystemPromptPart():
            return SystemPayload(text=part.content)
        case UserPromptPart():
            return UserInputPayload(text=part.content if isinstance(part.content, str) else str(part.content))
        case ToolReturnPart():
            status = ToolStatus.SUCCESS if part.outcome == "success" else ToolStatus.ERROR
            return ToolOutcomePayload(
                call_id=part.tool_call_id, status=status, text=part.model_response_str()
            )
    return None


def from_prepared(prepared: PreparedContext, *, mark: int) -> list[ModelMessage]:
    """The prepared context as Pydantic AI messages, each marked with ``mark`` turns recorded."""
    names = tool_names(prepared.messages)
    metadata: dict[str, Any] = {MARK: mark}
    history: list[ModelMessage] = []
    parts: list[ModelRequestPart] = []
    for message in prepared.messages:
        if message.role == "assistant":
            if parts:
                history.append(ModelRequest(parts=parts, metadata=metadata))
                parts = []
            history.append(ModelResponse(parts=_response_parts(message), metadata=metadata))
        else:
            parts.append(_request_part(message, names))
    if parts:
        history.append(ModelRequest(parts=parts, metadata=metadata))
    return history


def _request_part(message: ChatMessage, names: dict[str, str]) -> ModelRequestPart:
    content = message.content or ""
    match message.role:
        case "system":
            return SystemPromptPart(content=content)
        case "user":
            return UserPromptPart(content=content)
        case "tool":
            call_id = message.tool_call_id or ""
            return ToolReturnPart(tool_name=names.get(call_id, ""), content=content, tool_call_id=call_id)
        case "assistant":
            raise AssertionError("an assistant message is a response, not a request part")


def _response_parts(message: ChatMessage) -> list[ModelResponsePart]:
    parts: list[ModelResponsePart] = [TextPart(content=message.content)] if message.content else []
    parts += [
        ToolCallPart(tool_name=c.function.name, args=call_arguments(c.function.arguments), tool_call_id=c.id)
        for c in message.tool_calls or ()
    ]
    return parts
