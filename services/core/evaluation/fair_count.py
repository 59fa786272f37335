"""One token count for every system's context, so that ctxfleet and the baselines compare fairly.

It counts what an OpenAI-compatible provider is sent, after OpenAI's published recipe: per message
a fixed framing plus its role and content; per tool call its id, name and arguments plus framing;
a tool message's call id; the tools array as serialized JSON; and the reply priming. It is
deliberately independent of the fleet's own budget count (``services.core.render``), which it checks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pydantic import JsonValue

from services.core.tokens import TokenCounter

__all__ = [
    "ContextCounter",
    "MESSAGE_FRAMING",
    "REPLY_PRIMING",
    "TOOL_CALL_FRAMING",
    "count_context",
    "count_message",
    "count_tools",
    "message_key",
]

MESSAGE_FRAMING = 3
TOOL_CALL_FRAMING = 3
REPLY_PRIMING = 3


def count_message(message: Mapping[str, JsonValue], counter: TokenCounter) -> int:
    """Tokens of one chat message as sent."""
    tokens = (
        MESSAGE_FRAMING
        + counter.count(_text(message.get("role")))
        + counter.count(_text(message.get("content")))
    )
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if not isinstance(call, dict):
                continue
            function = call.get("function")
            fn = function if isinstance(function, dict) else {}
            tokens += TOOL_CALL_FRAMING + counter.count(_text(call.get("id")))
            tokens += counter.count(_text(fn.get("name"))) + counter.count(_text(fn.get("arguments")))
    tokens += counter.count(_text(message.get("tool_call_id")))
    return tokens


def count_tools(tools: Sequence[Mapping[str, JsonValue]], counter: TokenCounter) -> int:
    """Tokens of the tools array as the provider serializes it (``[]`` costs nothing)."""
    if not tools:
        return 0
    wrapped = [{"type": "function", "function": dict(t)} for t in tools]
    return counter.count(json.dumps(wrapped, ensure_ascii=False, separators=(",", ":")))


def count_context(
    messages: Sequence[Mapping[str, JsonValue]],
    counter: TokenCounter,
    tools: Sequence[Mapping[str, JsonValue]] = (),
) -> int:
    """Tokens of a whole request: tools, every message, and the reply priming."""
    return count_tools(tools, counter) + sum(count_message(m, counter) for m in messages) + REPLY_PRIMING


def _text(value: JsonValue | None) -> str:
    return value if isinstance(value, str) else ""


class ContextCounter:
    """``count_context`` with each distinct message counted once (baselines re-send the same messages)."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._memo: dict[tuple[object, ...], int] = {}

    def message(self, message: Mapping[str, JsonValue]) -> int:
        """Tokens of one message."""
        key = message_key(message)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = count_message(message, self.counter)
        return found

    def messages(self, messages: Sequence[Mapping[str, JsonValue]]) -> int:
        """Tokens of messages, without the reply priming or tools."""
        return sum(self.message(m) for m in messages)

    def context(
        self, messages: Sequence[Mapping[str, JsonValue]], tools: Sequence[Mapping[str, JsonValue]] = ()
    ) -> int:
        """Tokens of a whole request, as ``count_context``."""
        return count_tools(tools, self.counter) + self.messages(messages) + REPLY_PRIMING


def message_key(message: Mapping[str, JsonValue]) -> tuple[object, ...]:
    """What makes two messages the same message to a count or a cache, hashable."""
    # Cheaper than serializing: the content strings come from the trace, and str caches its hash.
    calls = message.get("tool_calls")
    shape: list[object] = []
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(call, dict) and isinstance(fn, dict):
            shape.append((call.get("id"), fn.get("name"), fn.get("arguments")))
        else:
            shape.append(json.dumps(call, sort_keys=True))
    return (message.get("role"), message.get("content"), message.get("tool_call_id"), tuple(shape))
