"""A provider request's messages as the events they record (``shapes``, invariants 1 and 3)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from contracts import (
    AssistantMessagePayload,
    SystemPayload,
    ToolCall,
    ToolOutcomePayload,
    ToolSchema,
    ToolStatus,
    UserInputPayload,
)
from contracts.exceptions import InvalidRequest

from .shapes import Conversation, Family, Item, Json, Payload

__all__ = ["anthropic_assistant", "chat_assistant", "read_request", "responses_items"]


def read_request(family: Family, body: object) -> Conversation:
    """The conversation a provider request body carries.

    Raises:
        InvalidRequest: not a JSON object of this API, or content the proxy cannot record.
    """
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", field="body")
    obj: Json = body
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("the request names no model", field="model")
    try:
        return _conversation(family, obj, model)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        # A field of the wrong type or missing: the SDKs never send one, a hand-written client may.
        raise InvalidRequest(f"the request does not follow the {family.value} shape: {exc!r}") from None


def _conversation(family: Family, obj: Json, model: str) -> Conversation:
    match family:
        case Family.CHAT:
            items = _chat_items(_list(obj, "messages"))
            size = len(obj["messages"])
        case Family.RESPONSES:
            if obj.get("previous_response_id") is not None:
                raise InvalidRequest(
                    "previous_response_id keeps history at the provider; send the whole input",
                    field="previous_response_id",
                )
            raw = obj.get("input")
            inputs = [{"role": "user", "content": raw}] if isinstance(raw, str) else _list(obj, "input")
            system = _system_item(obj.get("instructions"))
            items = system + responses_items(inputs)
            size = len(inputs)
        case Family.MESSAGES:
            system = _system_item(_text_of(obj.get("system"), "system"))
            items = system + _messages_items(_list(obj, "messages"))
            size = len(obj["messages"])
    if not any(isinstance(i.payload, UserInputPayload) for i in items):
        raise InvalidRequest("the conversation has no user message", field="messages")
    return Conversation(
        model=model,
        stream=obj.get("stream") is True,
        tools=tuple(_tool(family, t) for t in obj.get("tools") or ()),
        items=tuple(items),
        answer_position=size,
    )


def _list(obj: Json, name: str) -> list[Any]:
    value = obj.get(name)
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"the request's {name} must be a non-empty list", field=name)
    return value


def _system_item(text: str | None) -> list[Item]:
    return [Item("system", SystemPayload(text=text))] if text else []


def _text_of(content: object, where: str) -> str:
    """The text of a message's content: a string, or text parts (any other part is refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: content must be text or a list of parts", field=where)
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidRequest(f"{where}: the proxy records text only, not {kind!r} parts", field=where)
        texts.append(str(part.get("text", "")))
    return "\n".join(texts)


_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def _args(arguments: object) -> dict[str, Any]:
    """Tool arguments as the fleet keeps them: a JSON object (a string is parsed first)."""
    parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else arguments or {}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def chat_assistant(content: object, calls: Iterable[Json]) -> AssistantMessagePayload:
    return AssistantMessagePayload(
        text=_text_of(content, "assistant"),
        tool_calls=tuple(
            ToolCall(call_id=c["id"], name=c["function"]["name"], args=_args(c["function"].get("arguments")))
            for c in calls
        ),
    )


def anthropic_assistant(content: object) -> AssistantMessagePayload:
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(_blocks(content))
    texts = [b for b in blocks if b.get("type") == "text"]
    uses = [b for b in blocks if b.get("type") == "tool_use"]
    if len(texts) + len(uses) != len(blocks):
        kinds = sorted({str(b.get("type")) for b in blocks} - {"text", "tool_use"})
        raise InvalidRequest(f"assistant: the proxy records text and tool_use only, not {kinds}")
    return AssistantMessagePayload(
        text=_text_of(texts, "assistant"),
        tool_calls=tuple(ToolCall(call_id=b["id"], name=b["name"], args=_args(b.get("input"))) for b in uses),
    )


def _blocks(content: object) -> Iterator[Json]:
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise InvalidRequest("a message's content must be text or a list of blocks", field="messages")
    yield from content


def _chat_items(messages: list[Any]) -> list[Item]:
    items = []
    for n, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        payload: Payload
        match role:
            case "system" | "developer":
                payload = SystemPayload(text=_text_of(content, role))
            case "user":
                payload = UserInputPayload(text=_text_of(content, role))
            case "assistant":
                payload = chat_assistant(content, message.get("tool_calls") or ())
            case "tool":
                payload = ToolOutcomePayload(call_id=message["tool_call_id"], text=_text_of(content, role))
            case _:
                raise InvalidRequest(f"messages[{n}]: role {role!r} is not one the proxy records")
        items.append(Item(f"{n}.0", payload))
    return items


def responses_items(inputs: list[Any], start: int = 0) -> list[Item]:
    """Responses input items; an assistant message and the calls after it are one answer."""
    items: list[Item] = []
    answer: tuple[int, str, list[ToolCall]] | None = None
    for n, entry in enumerate(inputs, start):
        kind = entry.get("type", "message") if isinstance(entry, dict) else None
        role = entry.get("role") if kind == "message" else None
        if kind == "reasoning":
            continue  # the provider's own scratch, resent only for its cache
        if kind == "function_call" or role == "assistant":
            at, text, calls = answer or (n, "", [])
            if kind == "function_call":
                calls.append(
                    ToolCall(call_id=entry["call_id"], name=entry["name"], args=_args(entry["arguments"]))
                )
            else:
                text = "\n".join(t for t in (text, _text_of(entry.get("content"), "assistant")) if t)
            answer = (at, text, calls)
            continue
        if answer is not None:
            items.append(_answer_item(*answer))
            answer = None
        payload: Payload
        match kind, role:
            case "message", "system" | "developer":
                payload = SystemPayload(text=_text_of(entry.get("content"), role))
            case "message", "user":
                payload = UserInputPayload(text=_text_of(entry.get("content"), "user"))
            case "function_call_output", _:
                payload = ToolOutcomePayload(
                    call_id=entry["call_id"], text=_text_of(entry.get("output"), "output")
                )
            case _:
                raise InvalidRequest(f"input[{n}]: item {kind!r} ({role}) is not one the proxy records")
        items.append(Item(f"{n}.0", payload))
    if answer is not None:
        items.append(_answer_item(*answer))
    return items


def _answer_item(at: int, text: str, calls: list[ToolCall]) -> Item:
    return Item(f"{at}.0", AssistantMessagePayload(text=text, tool_calls=tuple(calls)))


def _messages_items(messages: list[Any]) -> list[Item]:
    items: list[Item] = []
    for n, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        match role:
            case "assistant":
                items.append(Item(f"{n}.0", anthropic_assistant(content)))
            case "user" if isinstance(content, str):
                items.append(Item(f"{n}.0", UserInputPayload(text=content)))
            case "user":
                blocks = list(_blocks(content))
                results = [b for b in blocks if b.get("type") == "tool_result"]
                for part, result in enumerate(results):
                    status = ToolStatus.ERROR if result.get("is_error") else ToolStatus.SUCCESS
                    text = _text_of(result.get("content"), "tool_result")
                    items.append(
                        Item(
                            f"{n}.{part}",
                            ToolOutcomePayload(call_id=result["tool_use_id"], status=status, text=text),
                        )
                    )
                rest = [b for b in blocks if b.get("type") != "tool_result"]
                if rest:
                    items.append(Item(f"{n}.{len(results)}", UserInputPayload(text=_text_of(rest, "user"))))
            case _:
                raise InvalidRequest(f"messages[{n}]: role {role!r} is not one the proxy records")
    return items


def _tool(family: Family, tool: object) -> ToolSchema:
    if not isinstance(tool, dict):
        raise InvalidRequest("each tool must be an object", field="tools")
    match family:
        case Family.CHAT:
            spec = tool.get("function") or {}
            return ToolSchema(
                name=spec["name"],
                description=spec.get("description", ""),
                parameters=spec.get("parameters", {}),
            )
        case Family.RESPONSES:
            return ToolSchema(
                name=tool["name"],
                description=tool.get("description") or "",
                parameters=tool.get("parameters") or {},
            )
        case Family.MESSAGES:
            return ToolSchema(
                name=tool["name"],
                description=tool.get("description", ""),
                parameters=tool.get("input_schema", {}),
            )
