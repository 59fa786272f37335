"""The canonical context as an OpenAI Responses API request body. Pure.

Chat's messages become Responses' input items: text turns are ``message`` items, each assistant
tool call its own ``function_call`` item right after the assistant's text, each tool result a
``function_call_output`` paired with its call by ``call_id``.

System messages: the leading run of them is joined into ``instructions``. Responses has no system
role in the middle of a conversation, so a system message after the first non-system one stays
where it is, in ``input``, as a ``developer`` message — moving it into ``instructions`` would
change what the model reads it as having come before.

Nothing is ``null`` on the wire: a key the context has no value for is left out.
"""

from __future__ import annotations

from typing import assert_never

from pydantic import JsonValue

from contracts import ChatMessage, ToolSchema

from .bundle import ContextBundle, leading_system

__all__ = ["INSTRUCTIONS_JOIN", "input_items", "input_sources", "responses_request"]

# Two newlines keep separately recorded instructions separate paragraphs, as Chat shows them.
INSTRUCTIONS_JOIN = "\n\n"


def responses_request(bundle: ContextBundle) -> dict[str, JsonValue]:
    """``{"instructions"?, "input", "tools"}`` for ``POST /v1/responses``."""
    leading = leading_system(bundle.messages)
    body: dict[str, JsonValue] = {}
    if leading:
        body["instructions"] = INSTRUCTIONS_JOIN.join(m.content or "" for m in bundle.messages[:leading])
    items: list[JsonValue] = []
    for message in bundle.messages[leading:]:
        items.extend(input_items(message))
    body["input"] = items
    body["tools"] = [_tool(t) for t in bundle.tools]
    return body


def input_sources(messages: tuple[ChatMessage, ...]) -> tuple[int, list[int]]:
    """How many leading system messages ``instructions`` joins, and the canonical message each
    ``input`` item comes from, in order."""
    leading = leading_system(messages)
    sources: list[int] = []
    for index in range(leading, len(messages)):
        sources.extend(index for _ in input_items(messages[index]))
    return leading, sources


def input_items(message: ChatMessage) -> list[JsonValue]:
    """The ``input`` items of one message past the leading system ones."""
    match message.role:
        case "system":
            return [_message("developer", message.content or "")]
        case "user":
            return [_message("user", message.content or "")]
        case "assistant":
            calls = message.tool_calls or ()
            # An assistant turn with neither text nor calls stays a turn, as it was in Chat.
            text = [_message("assistant", message.content or "")] if message.content or not calls else []
            return text + [
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.function.name,
                    "arguments": call.function.arguments,
                }
                for call in calls
            ]
        case "tool":
            # The assembler only emits a tool message as the answer to a call it also emits.
            assert message.tool_call_id is not None, "a canonical tool message answers a call"
            return [
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": message.content or "",
                }
            ]
        case _:
            assert_never(message.role)


def _message(role: str, content: str) -> JsonValue:
    return {"type": "message", "role": role, "content": content}


def _tool(tool: ToolSchema) -> JsonValue:
    # Not strict: strict mode requires every property to be required and no additional properties,
    # which the runtime's schemas do not promise.
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": False,
    }
