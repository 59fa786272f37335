"""The client side of the context tools: answer a model's ``context_read`` / ``context_search`` calls.

A runtime that asked for ``context_tools`` hands each model response to :class:`ContextTools`; the
context tools are answered here through ``ctx.read`` / ``ctx.search`` (scope-checked by the fleet
like any read-back) and come back as tool outcomes to record; every other call is left to the
runtime::

    answered = await ContextTools(client, session_id=s, run_id=r, instance_id=i).answer(response)
    for event in answered.outcomes: await client.append(event)

``response`` is an OpenAI Chat completion (or its message, or its ``tool_calls``), an OpenAI
Responses response (``function_call`` items) or an Anthropic message (``tool_use`` blocks), as a
dict or an SDK object. A refusal (another session's ref, a malformed call) is answered as an error
outcome naming its code, never as content; a retryable fleet error is raised, so the runtime can
retry the whole step.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, assert_never

from pydantic import JsonValue, ValidationError

from contracts import (
    ReadReply,
    ReadRequest,
    SearchReply,
    SearchRequest,
    ToolOutcomeEvent,
    ToolOutcomePayload,
    ToolStatus,
)

from contracts.context_refs import (
    CONTEXT_READ,
    CONTEXT_SEARCH,
    CONTEXT_TOOL_NAMES,
    BlobRef,
    RecordRef,
    parse_ref,
    record_ref,
)
from contracts.exceptions import CtxError, InvalidRequest

__all__ = [
    "DEFAULT_LINES",
    "SEARCH_LIMIT",
    "Answered",
    "ContextToolAnswer",
    "ContextTools",
    "ModelToolCall",
    "ReadsContext",
    "tool_calls_of",
]

# A line range with only its start reads this many lines.
DEFAULT_LINES = 200
# Hits a context_search answers with: enough to choose from, few enough to stay cheap.
SEARCH_LIMIT = 10


class ReadsContext(Protocol):
    """What the executor needs of a client (``FleetClient`` is one)."""

    async def read(self, request: ReadRequest, *, timeout: float = 10.0) -> ReadReply: ...

    async def search(self, request: SearchRequest, *, timeout: float = 10.0) -> SearchReply: ...


@dataclass(frozen=True, slots=True)
class ModelToolCall:
    """One tool call of a model response, whatever the provider: its id, name and parsed arguments."""

    call_id: str
    name: str
    # ``None`` when the model's arguments were not a JSON object.
    arguments: Mapping[str, JsonValue] | None


@dataclass(frozen=True, slots=True)
class ContextToolAnswer:
    """A context tool call answered: the outcome to record, and what the fleet replied."""

    call: ModelToolCall
    outcome: ToolOutcomeEvent
    reply: ReadReply | SearchReply | None
    # The error code of a refused call (``not_found`` for another session's ref), else ``None``.
    refused: str | None


@dataclass(frozen=True, slots=True)
class Answered:
    """A response's tool calls split: the context tools answered here, the rest left to the runtime."""

    answers: tuple[ContextToolAnswer, ...]
    others: tuple[ModelToolCall, ...]

    @property
    def outcomes(self) -> tuple[ToolOutcomeEvent, ...]:
        """The tool outcomes to append, in call order."""
        return tuple(a.outcome for a in self.answers)


class ContextTools:
    """Answers the context tools of one thread's model responses through a fleet client."""

    def __init__(
        self,
        client: ReadsContext,
        *,
        session_id: str,
        run_id: str,
        instance_id: str,
        principal_id: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self._client = client
        self._session_id = session_id
        self._run_id = run_id
        self._instance_id = instance_id
        self._principal_id = principal_id
        self._timeout = timeout

    async def answer(self, response: object) -> Answered:
        """Answer the context tool calls of ``response``; other calls are returned untouched."""
        calls = tool_calls_of(response)
        answers = [await self.answer_call(c) for c in calls if c.name in CONTEXT_TOOL_NAMES]
        return Answered(tuple(answers), tuple(c for c in calls if c.name not in CONTEXT_TOOL_NAMES))

    async def answer_call(self, call: ModelToolCall) -> ContextToolAnswer:
        """One context tool call, answered (or refused) as a tool outcome."""
        try:
            reply: ReadReply | SearchReply
            if call.name == CONTEXT_READ:
                reply = await self._client.read(self._read_request(call), timeout=self._timeout)
                text = _read_text(reply)
            elif call.name == CONTEXT_SEARCH:
                reply = await self._client.search(self._search_request(call), timeout=self._timeout)
                text = _search_text(reply)
            else:
                raise InvalidRequest(f"{call.name} is not a context tool")
        except CtxError as err:
            if err.retryable:
                raise
            text = f"[{call.name} refused: {err.code}] {err.message}"
            return ContextToolAnswer(call, self._outcome(call, text, ToolStatus.ERROR), None, str(err.code))
        return ContextToolAnswer(call, self._outcome(call, text, ToolStatus.SUCCESS), reply, None)

    def _read_request(self, call: ModelToolCall) -> ReadRequest:
        args = _arguments(call)
        ref = args.get("ref")
        parsed = parse_ref(ref) if isinstance(ref, str) else None
        match parsed:
            case None:
                raise InvalidRequest(
                    f"ref must be ctx://blob/<sha256> or ctx://record/<thread_id>/<seq>, not {ref!r}"
                )
            case RecordRef() | BlobRef():
                pass
            case _:
                assert_never(parsed)
        lines = _line_range(args)
        byte_range = _byte_range(args)
        if lines is not None and byte_range is not None:
            raise InvalidRequest("give a line range (start_line, end_line) or a byte range (offset, length)")
        fields: dict[str, object] = {
            "session_id": self._session_id,
            "principal_id": self._principal_id,
            "ref": parsed.ref,
        }
        if lines is not None:
            fields["line"], fields["lines"] = lines
        if byte_range is not None:
            fields["offset"], fields["length"] = byte_range
        return _validated(ReadRequest, fields)

    def _search_request(self, call: ModelToolCall) -> SearchRequest:
        args = _arguments(call)
        kind = args.get("kind")
        fields: dict[str, object] = {
            "session_id": self._session_id,
            "principal_id": self._principal_id,
            "query": args.get("query"),
            "kinds": (kind,) if kind is not None else (),
            "limit": SEARCH_LIMIT,
        }
        return _validated(SearchRequest, fields)

    def _outcome(self, call: ModelToolCall, text: str, status: ToolStatus) -> ToolOutcomeEvent:
        # One key per call: an answer recorded twice is the same event, dropped as a retry.
        digest = hashlib.sha256(call.call_id.encode()).hexdigest()[:24]
        return ToolOutcomeEvent(
            event_key=f"ctx-tool:{digest}",
            session_id=self._session_id,
            run_id=self._run_id,
            instance_id=self._instance_id,
            principal_id=self._principal_id,
            payload=ToolOutcomePayload(call_id=call.call_id, status=status, text=text),
        )


def tool_calls_of(response: object) -> tuple[ModelToolCall, ...]:
    """The tool calls of a model response in any supported provider shape, in call order."""
    data = _plain(response)
    if isinstance(data, list):
        return tuple(c for item in data for c in _calls_of_item(item))
    if not isinstance(data, dict):
        return ()
    choices = data.get("choices")
    if isinstance(choices, list) and choices:  # a Chat completion: its first choice's message
        first = choices[0]
        return tool_calls_of(first.get("message") if isinstance(first, dict) else None)
    for key in ("tool_calls", "output", "content"):  # Chat message, Responses response, Anthropic message
        items = data.get(key)
        if isinstance(items, list):
            return tuple(c for item in items for c in _calls_of_item(item))
    return ()


def _calls_of_item(item: JsonValue) -> tuple[ModelToolCall, ...]:
    if not isinstance(item, dict):
        return ()
    if item.get("type") == "function" and isinstance(item.get("function"), dict):  # OpenAI Chat
        fn = item["function"]
        assert isinstance(fn, dict)
        return (
            ModelToolCall(str(item.get("id", "")), str(fn.get("name", "")), _parsed(fn.get("arguments"))),
        )
    if item.get("type") == "function_call":  # OpenAI Responses
        return (
            ModelToolCall(
                str(item.get("call_id", "")), str(item.get("name", "")), _parsed(item.get("arguments"))
            ),
        )
    if item.get("type") == "tool_use":  # Anthropic Messages
        args = item.get("input")
        return (
            ModelToolCall(
                str(item.get("id", "")), str(item.get("name", "")), args if isinstance(args, dict) else None
            ),
        )
    return ()


def _plain(response: object) -> JsonValue:
    """A dict/list view of ``response``: SDK objects (pydantic models) are dumped, lists of them too."""
    dump = getattr(response, "model_dump", None)
    if callable(dump):
        return _plain(dump(mode="json"))
    if isinstance(response, Sequence) and not isinstance(response, str | bytes):
        return [_plain(r) for r in response]
    if isinstance(response, Mapping):
        return {str(k): _plain(v) for k, v in response.items()}
    if response is None or isinstance(response, str | int | float | bool):
        return response
    return None


def _parsed(arguments: JsonValue) -> Mapping[str, JsonValue] | None:
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return None
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _arguments(call: ModelToolCall) -> Mapping[str, JsonValue]:
    if call.arguments is None:
        raise InvalidRequest(f"the arguments of {call.name} are not a JSON object")
    return call.arguments


def _line_range(args: Mapping[str, JsonValue]) -> tuple[int, int] | None:
    start, end = args.get("start_line"), args.get("end_line")
    if start is None and end is None:
        return None
    first = _int(start, "start_line") if start is not None else 1
    last = _int(end, "end_line") if end is not None else first + DEFAULT_LINES - 1
    if first < 1 or last < first:
        raise InvalidRequest(f"lines {first}–{last} are not a range (1-based, end at or after start)")
    return first, last - first + 1


def _byte_range(args: Mapping[str, JsonValue]) -> tuple[int, int] | None:
    offset, length = args.get("offset"), args.get("length")
    if offset is None and length is None:
        return None
    return (
        _int(offset, "offset") if offset is not None else 0,
        _int(length, "length") if length is not None else 65_536,
    )


def _int(value: JsonValue, name: str) -> int:
    # JSON has one number type: 40000.0 is the model's 40000, 1.5 is not a position.
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise InvalidRequest(f"{name} must be an integer, not {value!r}")
    return int(value)


_M = TypeVar("_M", ReadRequest, SearchRequest)


def _validated(model: type[_M], fields: dict[str, object]) -> _M:
    try:
        return model.model_validate(fields)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise InvalidRequest(f"invalid arguments: {problems}") from err


def _read_text(reply: ReadReply) -> str:
    """The range read, after one line that says where it lies and where to continue."""
    end = reply.offset + len(reply.content.encode())
    if reply.line is not None:
        last = reply.next_line - 1 if reply.next_line is not None else reply.total_lines
        where = f"lines {reply.line}–{last} of {reply.total_lines}"
        more = f"; next start_line {reply.next_line}" if reply.next_line is not None else "; end of content"
    else:
        where = f"bytes {reply.offset}–{end} of {reply.total_bytes}"
        more = f"; next offset {reply.next_offset}" if reply.next_offset is not None else "; end of content"
    return f"[{reply.ref} {where}{more}; sha256 verified]\n{reply.content}"


def _search_text(reply: SearchReply) -> str:
    if not reply.hits:
        return "[no hits]"
    lines = [f"[{len(reply.hits)} hit(s), best first; each names its ref]"]
    for h in reply.hits:
        where = f"lines {h.start_line}–{h.end_line}"
        stale = ", superseded" if h.superseded else ""
        lines.append(f"{record_ref(h.thread_id, h.seq)} ({h.kind}{stale}, {where}): {h.snippet}")
    return "\n".join(lines)
