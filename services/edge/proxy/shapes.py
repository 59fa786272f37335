"""The three provider APIs the proxy speaks, as values: threads, event keys, what goes upstream.

Pure functions over the JSON bodies the official SDKs send and receive; ``reading`` turns a request
into events, ``answers`` reads a response, and the server (``services.edge.proxy.server``) does the
I/O. Invariants:

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

from contracts import AssistantMessagePayload, SystemPayload, ToolOutcomePayload, ToolSchema, UserInputPayload
from contracts.ids import ID_PATTERN
from contracts.profiles import ANTHROPIC_MESSAGES, OPENAI_CHAT, OPENAI_RESPONSES, PROFILE_NAMES
from contracts.exceptions import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from contracts import PreparedContext
    from contracts.prepare import RequestFormat

__all__ = [
    "Conversation",
    "Family",
    "Item",
    "Json",
    "Payload",
    "ThreadRef",
    "find_thread",
    "profile_of",
    "upstream_body",
]

Payload: TypeAlias = SystemPayload | UserInputPayload | AssistantMessagePayload | ToolOutcomePayload
Json: TypeAlias = dict[str, Any]

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


def upstream_body(family: Family, body: Json, prepared: PreparedContext, *, answer_position: int) -> Json:
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
