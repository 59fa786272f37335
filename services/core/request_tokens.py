"""An independent count of a prepared request, exactly as it is sent. Pure.

Written apart from the assembler's arithmetic (which adds up token counts fixed at recording) to
check it: this one walks the rendered request — ``prepared.messages`` dumped with
``exclude_none=True`` and the tools array in the provider's shape — and tokenizes every string
that is sent, plus the chat framing of OpenAI's published counting recipe:

- every message: 3 framing tokens (start, separator, end) + its role + every other string field
  (``content``, ``tool_call_id``, ``name``);
- every tool call: its ``id``, ``type``, ``function.name`` and ``function.arguments`` + 2 framing
  tokens (the call's own start and end);
- the tools array: the JSON text of ``[{"type": "function", "function": {...}}, ...]``;
- the reply is primed with 3 tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pydantic import JsonValue

from contracts import PreparedContext, ToolSchema

from services.core.tokens import TokenCounter

__all__ = ["count_prepared", "count_request", "tools_wire"]

_PER_MESSAGE = 3
_PER_CALL = 2
_PRIMING = 3


def tools_wire(tools: Sequence[ToolSchema]) -> list[dict[str, JsonValue]]:
    """The tools array as an OpenAI-compatible endpoint is sent it."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def count_request(
    messages: Sequence[Mapping[str, JsonValue]],
    tools: Sequence[Mapping[str, JsonValue]],
    counter: TokenCounter,
) -> int:
    """Tokens of a chat request given as its wire JSON (messages and tools array)."""
    total = _PRIMING
    for message in messages:
        total += _PER_MESSAGE
        for key, value in message.items():
            if key == "tool_calls":
                assert isinstance(value, list)
                total += sum(_call(call, counter) for call in value)
            elif isinstance(value, str):
                total += counter.count(value)
    if tools:
        total += counter.count(json.dumps(list(tools), ensure_ascii=False, separators=(",", ":")))
    return total


def count_prepared(prepared: PreparedContext, counter: TokenCounter) -> int:
    """Tokens of a prepared context as it is sent: its messages and its tools."""
    messages = [m.model_dump(mode="json", exclude_none=True) for m in prepared.messages]
    return count_request(messages, tools_wire([t.function for t in prepared.tools]), counter)


def _call(call: JsonValue, counter: TokenCounter) -> int:
    assert isinstance(call, dict)
    function = call["function"]
    assert isinstance(function, dict)
    strings = (call.get("id"), call.get("type"), function.get("name"), function.get("arguments"))
    return _PER_CALL + sum(counter.count(s) for s in strings if isinstance(s, str))
