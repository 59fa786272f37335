"""What a provider answered, read from its response or its stream, and its context-length refusals."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pydantic import ValidationError

from contracts import AssistantMessagePayload
from contracts.exceptions import InvalidRequest

from .reading import anthropic_assistant, chat_assistant, responses_items
from .shapes import Family, Json

__all__ = ["Answer", "Overflow", "StreamAnswer", "read_answer", "read_overflow"]


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


def read_answer(family: Family, body: object) -> Answer:
    """The answer in a provider's (non-streamed) response body.

    Raises:
        InvalidRequest: a body that is not a response of this API.
    """
    try:
        if not isinstance(body, dict):
            raise TypeError(f"a response body must be a JSON object, not {type(body).__name__}")
        obj: Json = body
        match family:
            case Family.CHAT:
                message = obj["choices"][0]["message"]
                payload = chat_assistant(message.get("content"), message.get("tool_calls") or ())
                usage = obj.get("usage") or {}
                return Answer(payload, usage.get("prompt_tokens"), usage.get("completion_tokens") or 0)
            case Family.RESPONSES:
                answers = responses_items(obj.get("output") or [], start=0)
                payload = next(
                    (i.payload for i in answers if isinstance(i.payload, AssistantMessagePayload)),
                    AssistantMessagePayload(),
                )
                usage = obj.get("usage") or {}
                return Answer(payload, usage.get("input_tokens"), usage.get("output_tokens") or 0)
            case Family.MESSAGES:
                payload = anthropic_assistant(obj.get("content") or [])
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
        self.calls: dict[int, Json] = {}
        self.usage: Json = {}
        self.completed: Json | None = None

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

    def _feed_messages(self, event: str, chunk: Json) -> bool:
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
