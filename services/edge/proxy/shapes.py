"""The three provider APIs the proxy speaks, as values: what a request records, what goes upstream.

Pure functions over the JSON bodies the official SDKs send and receive; the server
(``services.edge.proxy.server``) does the I/O. Invariants:

1. Every message of a request maps to the same events on every request that carries it: an
   event's key is its position in the conversation and the hash of its content
   (``px/<position>.<part>/<hash>``), so a retried or longer request republishes only duplicates.
2. A response is recorded at the position it will take in the next request, with the payload that
   request's copy of it maps to: the answer the fleet recorded and the one the caller sends back
   are one event.
3. Only text, tool calls and tool results are recorded; any other content is refused as
   ``InvalidRequest`` rather than dropped from the ledger without a word.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import ValidationError

from contracts import (
    AssistantMessagePayload,
    SystemPayload,
    ToolCall,
    ToolOutcomePayload,
    ToolSchema,
    ToolStatus,
    UserInputPayload,
)
from contracts.ids import ID_PATTERN
from contracts.profiles import ANTHROPIC_MESSAGES, OPENAI_CHAT, OPENAI_RESPONSES, PROFILE_NAMES
from services.errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from contracts import PreparedContext
    from contracts.prepare import RequestFormat

__all__ = [
    "Answer",
    "Conversation",
    "Family",
    "Item",
    "Overflow",
    "Payload",
    "StreamAnswer",
    "ThreadRef",
    "find_thread",
    "profile_of",
    "read_answer",
    "read_overflow",
    "read_request",
    "upstream_body",
]

Payload: TypeAlias = SystemPayload | UserInputPayload | AssistantMessagePayload | ToolOutcomePayload
_Json: TypeAlias = dict[str, Any]

_ID = re.compile(ID_PATTERN)


class Family(StrEnum):
    """A provider API, by the path its SDK posts to."""

    CHAT = "openai.chat"
    RESPONSES = "openai.responses"
    MESSAGES = "anthropic.messages"

    @property
    def request_format(self) -> RequestFormat:
        """The ``PrepareRequest.format`` that answers in this API's shape."""
        match self:
            case Family.CHAT:
                return OPENAI_CHAT
            case Family.RESPONSES:
                return OPENAI_RESPONSES
            case Family.MESSAGES:
                return ANTHROPIC_MESSAGES


@dataclass(frozen=True)
class Item:
    """One event to record: where it sits in the conversation, what it says, and its key.

    The key is ``px/<label>/<hash>``: position and content, so a resent message is the same event.
    """

    label: str
    payload: Payload
    event_key: str = field(init=False)

    def __post_init__(self) -> None:
        # The payload's JSON in field order: the same payload always writes the same bytes.
        content = f"{type(self.payload).__name__}\n{self.payload.model_dump_json()}".encode()
        key = f"px/{self.label}/{hashlib.sha256(content).hexdigest()[:16]}"
        object.__setattr__(self, "event_key", key)


@dataclass(frozen=True)
class Conversation:
    """What a request says: the model, whether it streams, the tools offered and the messages."""

    model: str
    stream: bool
    tools: tuple[ToolSchema, ...]
    items: tuple[Item, ...]
    # Where the answer to this request sits in the next request's messages.
    answer_position: int


@dataclass(frozen=True)
class ThreadRef:
    """The fleet thread a request belongs to."""

    session_id: str
    run_id: str
    instance_id: str = "main"


@dataclass(frozen=True)
class Answer:
    """The model's answer to record, and the usage the provider reported for it."""

    payload: AssistantMessagePayload
    input_tokens: int | None
    output_tokens: int


@dataclass(frozen=True)
class Overflow:
    """The provider refused the request as longer than its window: the figures its message gave."""

    limit: int | None
    count: int | None


def read_request(family: Family, body: object) -> Conversation:
    """The conversation a provider request body carries.

    Raises:
        InvalidRequest: not a JSON object of this API, or content the proxy cannot record.
    """
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", field="body")
    obj: _Json = body
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("the request names no model", field="model")
    try:
        return _conversation(family, obj, model)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        # A field of the wrong type or missing: the SDKs never send one, a hand-written client may.
        raise InvalidRequest(f"the request does not follow the {family.value} shape: {exc!r}") from None


def _conversation(family: Family, obj: _Json, model: str) -> Conversation:
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
            items = system + _responses_items(inputs)
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


def find_thread(headers: Mapping[str, str], conversation: Conversation) -> ThreadRef:
    """The thread named by ``ctx-thread`` (and ``ctx-session``), else one derived from the start.

    A derived id is the hash of the conversation up to its first user message (instructions and
    question): every request of one conversation carries that start, so they all find one thread.
    Two conversations that start alike need ``ctx-thread`` to be told apart.

    Raises:
        InvalidRequest: a header that is not an identifier (letters, digits, ``_``, ``-``).
    """
    run = headers.get("ctx-thread")
    if run is None:
        start: list[object] = []
        for item in conversation.items:
            start.append([type(item.payload).__name__, item.payload.model_dump(mode="json")])
            if isinstance(item.payload, UserInputPayload):
                break
        digest = hashlib.sha256(json.dumps(start, sort_keys=True).encode()).hexdigest()
        run = f"px-{digest[:32]}"
    session = headers.get("ctx-session", run)
    for name, value in (("ctx-thread", run), ("ctx-session", session)):
        if not _ID.match(value):
            raise InvalidRequest(f"{name} must be 1-128 letters, digits, '_' or '-'", header=name)
    return ThreadRef(session_id=session, run_id=run)


def profile_of(model: str) -> str | None:
    """The built-in profile of a model name: the longest profile name it starts with."""
    matches = [p for p in PROFILE_NAMES if model == p or model.startswith(p + "-")]
    return max(matches, key=len, default=None)


def upstream_body(family: Family, body: _Json, prepared: PreparedContext, *, answer_position: int) -> _Json:
    """The caller's request with the fleet's context in place of its history; all else unchanged.

    A retried request whose answer the fleet already recorded gets a context ending in that answer;
    it is left out (invariant 2 places it at ``answer_position``), so the model is asked the same
    question again rather than shown its own reply.
    """
    answered = _answered_at(prepared, answer_position)
    match family:
        case Family.CHAT:
            messages = prepared.openai_messages()
            out = {**body, "messages": _drop_answer(messages, answered, _is_chat_answer)}
            if body.get("stream") is True and "stream_options" not in body:
                # Usage is what calibrates the fleet's counts; a streamed chat reports it only if asked.
                out["stream_options"] = {"include_usage": True}
            return out
        case Family.RESPONSES:
            request = prepared.request or {}
            out = {k: v for k, v in body.items() if k != "instructions"}
            out["input"] = _drop_answer(_listed(request.get("input")), answered, _is_responses_answer)
            if "instructions" in request:
                out["instructions"] = request["instructions"]
            return out
        case Family.MESSAGES:
            request = prepared.request or {}
            out = {k: v for k, v in body.items() if k != "system"}
            out["messages"] = _drop_answer(_listed(request.get("messages")), answered, _is_chat_answer)
            if "system" in request:
                out["system"] = request["system"]
            return out


def _answered_at(prepared: PreparedContext, position: int) -> bool:
    last = prepared.source_watermark.last_event_key or ""
    return last.startswith(f"px/{position}.")


def _listed(value: object) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _is_chat_answer(message: object) -> bool:
    return isinstance(message, dict) and message.get("role") == "assistant"


def _is_responses_answer(item: object) -> bool:
    return isinstance(item, dict) and (item.get("type") == "function_call" or item.get("role") == "assistant")


def _drop_answer(messages: list[Any], answered: bool, is_answer: Callable[[object], bool]) -> list[Any]:
    while answered and messages and is_answer(messages[-1]):
        messages = messages[:-1]
    return messages


def read_answer(family: Family, body: object) -> Answer:
    """The answer in a provider's (non-streamed) response body.

    Raises:
        InvalidRequest: a body that is not a response of this API.
    """
    try:
        if not isinstance(body, dict):
            raise TypeError(f"a response body must be a JSON object, not {type(body).__name__}")
        obj: _Json = body
        match family:
            case Family.CHAT:
                message = obj["choices"][0]["message"]
                payload = _assistant(message.get("content"), message.get("tool_calls") or ())
                usage = obj.get("usage") or {}
                return Answer(payload, usage.get("prompt_tokens"), usage.get("completion_tokens") or 0)
            case Family.RESPONSES:
                answers = _responses_items(obj.get("output") or [], start=0)
                payload = next(
                    (i.payload for i in answers if isinstance(i.payload, AssistantMessagePayload)),
                    AssistantMessagePayload(),
                )
                usage = obj.get("usage") or {}
                return Answer(payload, usage.get("input_tokens"), usage.get("output_tokens") or 0)
            case Family.MESSAGES:
                payload = _anthropic_assistant(obj.get("content") or [])
                usage = obj.get("usage") or {}
                sent = [usage.get(k) for k in _ANTHROPIC_INPUT_FIELDS]
                counted = sum(n for n in sent if isinstance(n, int)) if sent[0] is not None else None
                return Answer(payload, counted, usage.get("output_tokens") or 0)
    except (KeyError, IndexError, TypeError, AttributeError, ValidationError) as exc:
        raise InvalidRequest(f"the upstream answered a body this proxy cannot read: {exc}") from None


# Anthropic counts cached input apart from the rest; the context's size is their sum.
_ANTHROPIC_INPUT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")

_OPENAI_LIMIT = re.compile(r"maximum context length is (\d+)")
_OPENAI_COUNT = re.compile(r"(?:resulted in|requested) (\d+) tokens")
_ANTHROPIC_COUNTS = re.compile(r"prompt is too long: (\d+) tokens > (\d+)")


def read_overflow(family: Family, status: int, body: object) -> Overflow | None:
    """The provider's context-length refusal in an error response, or None for any other error."""
    if status != 400 or not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return None
    error = body["error"]
    message = str(error.get("message", ""))
    match family:
        case Family.CHAT | Family.RESPONSES:
            if error.get("code") != "context_length_exceeded":
                return None
            return Overflow(_int(_OPENAI_LIMIT, message), _int(_OPENAI_COUNT, message))
        case Family.MESSAGES:
            found = _ANTHROPIC_COUNTS.search(message)
            if found is None:
                return None
            return Overflow(limit=int(found[2]), count=int(found[1]))


class StreamAnswer:
    """Builds the answer of a streamed response from its server-sent events, in arrival order."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self.text: list[str] = []
        self.calls: dict[int, _Json] = {}
        self.usage: _Json = {}
        self.completed: _Json | None = None

    def feed(self, event: str, data: str) -> bool:
        """Take one event; True when it ends the stream (the answer is then complete)."""
        if self.family is Family.CHAT and data == "[DONE]":
            return True
        chunk = json.loads(data)
        match self.family:
            case Family.CHAT:
                self.usage = chunk.get("usage") or self.usage
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    self.text.append(delta.get("content") or "")
                    for call in delta.get("tool_calls") or ():
                        into = self.calls.setdefault(call["index"], {"arguments": ""})
                        function = call.get("function") or {}
                        into["id"] = call.get("id") or into.get("id")
                        into["name"] = function.get("name") or into.get("name")
                        into["arguments"] += function.get("arguments") or ""
                return False
            case Family.RESPONSES:
                if event == "response.completed":
                    self.completed = chunk["response"]
                    return True
                return False
            case Family.MESSAGES:
                return self._feed_messages(event, chunk)

    def _feed_messages(self, event: str, chunk: _Json) -> bool:
        if event == "message_start":
            self.usage = dict(chunk["message"].get("usage") or {})
        elif event == "content_block_start":
            block = chunk["content_block"]
            self.calls[chunk["index"]] = {**block, "partial": ""}
        elif event == "content_block_delta":
            delta, into = chunk["delta"], self.calls[chunk["index"]]
            into["text"] = into.get("text", "") + delta.get("text", "")
            into["partial"] += delta.get("partial_json", "")
        elif event == "message_delta":
            self.usage.update(chunk.get("usage") or {})
        return event == "message_stop"

    def answer(self) -> Answer:
        """The answer the events built, as ``read_answer`` reads the same response unstreamed."""
        match self.family:
            case Family.CHAT:
                calls = [
                    {"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for _, c in sorted(self.calls.items())
                ]
                message = {"content": "".join(self.text) or None, "tool_calls": calls}
                return read_answer(self.family, {"choices": [{"message": message}], "usage": self.usage})
            case Family.RESPONSES:
                return read_answer(self.family, self.completed or {})
            case Family.MESSAGES:
                blocks = []
                for _, block in sorted(self.calls.items()):
                    partial = block.pop("partial")
                    if block.get("type") == "tool_use" and partial:
                        block["input"] = json.loads(partial)
                    blocks.append(block)
                return read_answer(self.family, {"content": blocks, "usage": self.usage})


def _int(pattern: re.Pattern[str], text: str) -> int | None:
    found = pattern.search(text)
    return int(found[1]) if found else None


def _list(obj: _Json, name: str) -> list[Any]:
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


def _assistant(content: object, calls: Iterable[_Json]) -> AssistantMessagePayload:
    return AssistantMessagePayload(
        text=_text_of(content, "assistant"),
        tool_calls=tuple(
            ToolCall(call_id=c["id"], name=c["function"]["name"], args=_args(c["function"].get("arguments")))
            for c in calls
        ),
    )


def _anthropic_assistant(content: object) -> AssistantMessagePayload:
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


def _blocks(content: object) -> Iterator[_Json]:
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
                payload = _assistant(content, message.get("tool_calls") or ())
            case "tool":
                payload = ToolOutcomePayload(call_id=message["tool_call_id"], text=_text_of(content, role))
            case _:
                raise InvalidRequest(f"messages[{n}]: role {role!r} is not one the proxy records")
        items.append(Item(f"{n}.0", payload))
    return items


def _responses_items(inputs: list[Any], start: int = 0) -> list[Item]:
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
            items.append(
                Item(f"{answer[0]}.0", AssistantMessagePayload(text=answer[1], tool_calls=tuple(answer[2])))
            )
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
        items.append(
            Item(f"{answer[0]}.0", AssistantMessagePayload(text=answer[1], tool_calls=tuple(answer[2])))
        )
    return items


def _messages_items(messages: list[Any]) -> list[Item]:
    items: list[Item] = []
    for n, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        match role:
            case "assistant":
                items.append(Item(f"{n}.0", _anthropic_assistant(content)))
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
