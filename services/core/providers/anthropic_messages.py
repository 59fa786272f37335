"""The canonical context as an Anthropic Messages request body. Pure.

``anthropic_request(bundle)`` gives ``{"system": [...], "messages": [...], "tools": [...]}``, ready to
spread into ``messages.create`` next to ``model`` and ``max_tokens``. The rules, where the Chat
shape and the Messages API differ:

- The leading system messages become ``system`` text blocks. A system message after the
  conversation started has no place in ``system`` without reordering the context, so it stays
  where it is, as a user text block prefixed ``[system]``.
- An assistant message is its text and then one ``tool_use`` block per call (``input`` is the parsed
  arguments; arguments that are not a JSON object are kept whole as ``{"arguments": raw}``).
- The results of one assistant turn are ``tool_result`` blocks of one user message, in the order of
  the calls, ``is_error`` for the bundle's failed calls; user text right after joins that message.
- Roles alternate strictly: consecutive same-role messages merge into one message's block list.
  The API needs a user message first: when the canonical history opens with an assistant
  message (its question was summarized or dropped), a short user text block says so. Nothing is
  added at the end: a context that ends with an assistant message is sent as it is, and the API
  reads that message as the start of the reply.
- No empty text block and no null field is ever sent; ``system`` and ``tools`` are left out when
  empty. A body with ``tool_use`` or ``tool_result`` blocks and no tools, which the API refuses, is
  ``InvalidRequest`` instead. Call ids the API refuses (it takes ``[A-Za-z0-9_-]+``; an inherited
  call is shown as ``id@tag``) are rewritten, the same way in ``tool_use`` and ``tool_result``.
- Cache breakpoints (``cache_control: ephemeral``), at the boundaries that stay put from one prepare
  to the next: the last tool, the last system block, and the end of the head — the last
  content block produced by the head's last TASK or SUMMARY block, where the head is every block
  before the first INTERACTION block (instructions, what an earlier run left, the run's task, the
  summary). With no TASK or SUMMARY there, the head's last non-STATE block ends it (state changes
  with every patch). The fourth, the end of the history: the last content block before the trailing
  evidence and state, which change on every prepare. Between compactions the next prepare repeats
  everything up to it, so that request reads it from the cache (the API looks back from each
  breakpoint for the longest cached prefix) — the API's limit of four, all used.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, assert_never

from pydantic import JsonValue

from contracts import BlockKind, ChatMessage, ContextBlock, ToolSchema
from services.core.providers.bundle import ContextBundle, leading_system
from contracts.exceptions import InvalidRequest

__all__ = [
    "CONTINUES_TEXT",
    "MAX_BREAKPOINTS",
    "SYSTEM_PREFIX",
    "anthropic_request",
    "cache_breakpoints",
    "content_sources",
    "message_blocks",
]

# The API refuses a request with more cache breakpoints than this.
MAX_BREAKPOINTS = 4
# Opens the messages when the canonical history starts with an assistant message.
CONTINUES_TEXT = "[The conversation continues from earlier context.]"
# Marks a system message that came after the conversation started.
SYSTEM_PREFIX = "[system]"
_WIRE_ID = re.compile(r"[A-Za-z0-9_-]+")
_NOT_WIRE = re.compile(r"[^A-Za-z0-9_-]")

_Role = Literal["user", "assistant"]


@dataclass(slots=True)
class _Item:
    """One content block on its way into a message, and the canonical message it came from."""

    role: _Role
    block: dict[str, JsonValue]
    # Index into ``bundle.messages``; -1 for the opening block this adapter adds.
    source: int


def anthropic_request(bundle: ContextBundle) -> dict[str, JsonValue]:
    """The Messages API body (``system``, ``messages``, ``tools``) for ``bundle``, with cache breakpoints."""
    messages = bundle.messages
    system_sources, items = _body_items(messages, bundle.error_call_ids)
    system: list[JsonValue] = [{"type": "text", "text": messages[i].content or ""} for i in system_sources]
    head_end = _head_end(bundle.blocks)
    anchor = max((n for n, item in enumerate(items) if 0 <= item.source < head_end), default=None)
    if anchor is not None:
        _mark(items[anchor].block)
    history_end = _history_end(bundle.blocks)
    latest = max((n for n, item in enumerate(items) if 0 <= item.source < history_end), default=None)
    if latest is not None and latest != anchor:
        _mark(items[latest].block)
    tools: list[JsonValue] = [_tool(t) for t in bundle.tools]
    if not tools:
        _check_no_tool_blocks(items)
    if tools:
        _mark(tools[-1])
    if system:
        _mark(system[-1])

    body: dict[str, JsonValue] = {}
    if system:
        body["system"] = system
    body["messages"] = _grouped(items)
    if tools:
        body["tools"] = tools
    return body


def _check_no_tool_blocks(items: Sequence[_Item]) -> None:
    # The Messages API refuses a request with tool_use or tool_result blocks and no tools, so the body
    # would fail at the provider anyway: say so at prepare time, naming the fix.
    calls = sorted({str(i.block["name"]) for i in items if i.block["type"] == "tool_use"})
    if calls or any(i.block["type"] == "tool_result" for i in items):
        called: list[JsonValue] = [*calls]
        raise InvalidRequest(
            "an anthropic.messages body with tool_use or tool_result blocks needs tools, or the Messages "
            "API refuses it: pass the tools the calls used in PrepareRequest.tools (or context_tools)",
            format="anthropic.messages",
            missing="tools",
            called=called,
        )


def cache_breakpoints(messages: Sequence[ChatMessage], blocks: Sequence[ContextBlock]) -> tuple[int, ...]:
    """Where ``anthropic_request`` puts its message breakpoints, as counts of leading canonical
    messages: the leading system messages, the head's end and the history's end (the tools' own
    breakpoint lies before every message)."""
    ends = (leading_system(messages), _head_end(blocks), _history_end(blocks))
    return tuple(sorted({n for n in ends if n > 0}))


def message_blocks(
    messages: Sequence[ChatMessage], first: int, end: int, failed: frozenset[str]
) -> list[tuple[str, dict[str, JsonValue]]]:
    """``(role, content block)`` of ``messages[first:end]`` past the leading system messages, as the
    body renders them (before cache breakpoints): a tool group's results stay with its calls."""
    return [(item.role, item.block) for item in _items(messages[:end], first, failed)]


def content_sources(messages: Sequence[ChatMessage]) -> list[int]:
    """The canonical message each content block of the body comes from, in body order: the ``system``
    blocks, then every message's blocks; -1 for the opening block this adapter adds."""
    system_sources, items = _body_items(messages, frozenset())
    return [*system_sources, *(item.source for item in items)]


def _body_items(messages: Sequence[ChatMessage], failed: frozenset[str]) -> tuple[list[int], list[_Item]]:
    """The leading system messages that become ``system`` blocks, and the content blocks after them."""
    start = leading_system(messages)
    system = [i for i in range(start) if messages[i].content]
    items = _items(messages, start, failed)
    if items and items[0].role == "assistant":
        items.insert(0, _Item("user", {"type": "text", "text": CONTINUES_TEXT}, -1))
    return system, items


def _items(messages: Sequence[ChatMessage], start: int, failed: frozenset[str]) -> list[_Item]:
    """Content blocks in order, tool results sorted into their calls' order."""
    items: list[_Item] = []
    call_order: dict[str, int] = {}
    results: list[tuple[int, _Item]] = []
    for index in range(start, len(messages)):
        m = messages[index]
        if m.role != "tool" and results:
            items.extend(item for _, item in sorted(results, key=lambda r: r[0]))
            results = []
        text = m.content or ""
        match m.role:
            case "system":
                if text:
                    items.append(_Item("user", {"type": "text", "text": f"{SYSTEM_PREFIX} {text}"}, index))
            case "user":
                if text:
                    items.append(_Item("user", {"type": "text", "text": text}, index))
            case "assistant":
                if text:
                    items.append(_Item("assistant", {"type": "text", "text": text}, index))
                calls = m.tool_calls or ()
                call_order = {c.id: n for n, c in enumerate(calls)}
                for c in calls:
                    use: dict[str, JsonValue] = {
                        "type": "tool_use",
                        "id": _wire_id(c.id),
                        "name": c.function.name,
                        "input": _input(c.function.arguments),
                    }
                    items.append(_Item("assistant", use, index))
            case "tool":
                call_id = m.tool_call_id or ""
                result: dict[str, JsonValue] = {"type": "tool_result", "tool_use_id": _wire_id(call_id)}
                if text:
                    result["content"] = text
                if call_id in failed:
                    result["is_error"] = True
                # A result of no known call keeps its place after the known ones.
                results.append((call_order.get(call_id, len(call_order)), _Item("user", result, index)))
            case _:
                assert_never(m.role)
    items.extend(item for _, item in sorted(results, key=lambda r: r[0]))
    return items


def _grouped(items: Sequence[_Item]) -> list[JsonValue]:
    """Consecutive same-role blocks as one message each, so the roles alternate."""
    out: list[JsonValue] = []
    role: _Role | None = None
    content: list[JsonValue] = []
    for item in items:
        if item.role != role:
            if role is not None:
                out.append({"role": role, "content": content})
            role, content = item.role, []
        content.append(item.block)
    if role is not None:
        out.append({"role": role, "content": content})
    return out


def _head_end(blocks: Sequence[ContextBlock]) -> int:
    """The canonical message index where the head's cacheable end lies (exclusive); 0 for none."""
    head: list[ContextBlock] = []
    for block in blocks:
        if block.kind is BlockKind.INTERACTION:
            break
        head.append(block)
    anchored = [b for b in head if b.kind in (BlockKind.TASK, BlockKind.SUMMARY)]
    if not anchored:
        anchored = [b for b in head if b.kind is not BlockKind.STATE]
    if not anchored:
        return 0
    last = anchored[-1]
    return last.first_message + last.message_count


def _history_end(blocks: Sequence[ContextBlock]) -> int:
    """The canonical message index where the history ends (exclusive): before the trailing evidence
    (material) and state blocks, which the assembler places last because they change every time."""
    end = len(blocks)
    while end > 0 and blocks[end - 1].kind in (BlockKind.STATE, BlockKind.MATERIAL):
        end -= 1
    if end == 0:
        return 0
    last = blocks[end - 1]
    return last.first_message + last.message_count


def _input(arguments: str) -> dict[str, JsonValue]:
    """The parsed arguments object; anything else whole under ``arguments``, so nothing is lost."""
    try:
        parsed: JsonValue = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": arguments}


def _wire_id(call_id: str) -> str:
    # A suffix from the whole id keeps two ids that differ only in refused characters apart.
    if _WIRE_ID.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:12]
    return f"{_NOT_WIRE.sub('_', call_id)}-{digest}"


def _tool(tool: ToolSchema) -> dict[str, JsonValue]:
    entry: dict[str, JsonValue] = {"name": tool.name}
    if tool.description:
        entry["description"] = tool.description
    entry["input_schema"] = dict(tool.parameters) if tool.parameters else {"type": "object"}
    return entry


def _mark(block: JsonValue) -> None:
    assert isinstance(block, dict)
    block["cache_control"] = {"type": "ephemeral"}
