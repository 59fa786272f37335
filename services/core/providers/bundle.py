"""The canonical context an adapter renders into a provider's request. Pure.

The assembler builds one context whatever the provider: its messages and tools in OpenAI Chat shape
(the wire's ``PreparedContext.messages``/``tools``), and the blocks they came from. An adapter needs a
little more than the Chat shape says — which tool results failed (Anthropic's ``is_error``) and
where the stable prefix ends (cache breakpoints) — and finds it here, so it never parses text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts import ChatMessage, ContextBlock, ToolSchema

__all__ = ["ContextBundle", "leading_system"]


@dataclass(frozen=True, slots=True)
class ContextBundle:
    """Messages and tools in canonical (OpenAI Chat) shape, with their blocks and failed tool results."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSchema, ...]
    # Each block's kind and the messages it produced (``first_message``, ``message_count``), in order.
    blocks: tuple[ContextBlock, ...]
    # ``tool_call_id``s of tool messages whose outcome was not a success.
    error_call_ids: frozenset[str] = frozenset()


def leading_system(messages: Sequence[ChatMessage]) -> int:
    """How many system messages open ``messages``: the instruction position of every provider shape."""
    for index, message in enumerate(messages):
        if message.role != "system":
            return index
    return len(messages)
