"""The read-side record: what the assembler needs of one ledger record, typed per kind.

A record's kind is the wire's :class:`~contracts.EventKind` and its payload a typed body (one
frozen dataclass per kind, mirroring the wire payloads of ``contracts/events.py``). The body is
parsed once, when the record is built from its row; the view loader caches records per thread, so
no prepare parses again. Parsing is plain code over the stored JSON, not pydantic: the recorder
validated it already.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeAlias, assert_never

from pydantic import JsonValue

from contracts import (
    AssistantMessageEvent,
    ChildResultEvent,
    ChildStatus,
    ContextExportEvent,
    ContextResetEvent,
    Event,
    EventKind,
    OperationReconcileEvent,
    PhaseChangeEvent,
    ResourceActivatedEvent,
    RunStatusEvent,
    StatePatchEvent,
    SystemEvent,
    ToolOutcomeEvent,
    ToolStatus,
    UserInputEvent,
)

from services.core.tokens import EncodingName

__all__ = [
    "AssistantMessageBody",
    "CallBody",
    "ChildResultBody",
    "ContextExportBody",
    "ContextResetBody",
    "LedgerRecord",
    "OperationReconcileBody",
    "PhaseChangeBody",
    "Purpose",
    "RecordBody",
    "ResourceBody",
    "RunEnd",
    "RunStatusBody",
    "StatePatchBody",
    "SystemBody",
    "TokenCounts",
    "ToolOutcomeBody",
    "UsageBody",
    "UserInputBody",
    "UserIntent",
    "ascending_by_seq",
    "call_json",
    "kind_of",
    "parse_body",
]


UserIntent: TypeAlias = Literal["question", "supplement"]
Purpose: TypeAlias = Literal["action", "completion"]
RunEnd: TypeAlias = Literal["completed", "failed", "cancelled", "interrupted"]


class TokenCounts:
    """Tokens of one piece of content in every supported encoding.

    ``cl100k_base`` may be given as a function that counts it: the recorder counts only o200k (what
    the default profiles and every estimate use), and the cl100k count is made on first use by a
    profile that needs it, then kept. Immutable, compared and hashed by both counts.
    """

    __slots__ = ("o200k_base", "_cl100k", "_count_cl100k")

    o200k_base: int
    _cl100k: int | None
    _count_cl100k: Callable[[], int] | None

    def __init__(self, o200k_base: int, cl100k_base: int | Callable[[], int]) -> None:
        object.__setattr__(self, "o200k_base", o200k_base)
        if callable(cl100k_base):
            object.__setattr__(self, "_cl100k", None)
            object.__setattr__(self, "_count_cl100k", cl100k_base)
        else:
            object.__setattr__(self, "_cl100k", cl100k_base)
            object.__setattr__(self, "_count_cl100k", None)

    @property
    def cl100k_base(self) -> int:
        """Tokens in cl100k_base, counted now if they were not yet."""
        if self._cl100k is None:
            assert self._count_cl100k is not None
            object.__setattr__(self, "_cl100k", self._count_cl100k())
            object.__setattr__(self, "_count_cl100k", None)
        assert self._cl100k is not None
        return self._cl100k

    @property
    def cl100k_counted(self) -> int | None:
        """The cl100k count if it was made, without making it (what the recorder stores)."""
        return self._cl100k

    def get(self, encoding: EncodingName) -> int:
        """Tokens in ``encoding``."""
        return self.o200k_base if encoding == "o200k_base" else self.cl100k_base

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"TokenCounts is immutable (cannot set {name})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenCounts):
            return NotImplemented
        return self.o200k_base == other.o200k_base and self.cl100k_base == other.cl100k_base

    def __hash__(self) -> int:
        return hash((self.o200k_base, self.cl100k_base))

    def __repr__(self) -> str:
        # Never counts: a log line or a failed assertion must not pay for (or hide) a deferred count.
        cl100k = "<not counted>" if self._cl100k is None else self._cl100k
        return f"TokenCounts(o200k_base={self.o200k_base}, cl100k_base={cl100k})"

    def __reduce__(self) -> tuple[type[TokenCounts], tuple[int, int]]:
        # copy and pickle rebuild it through __init__ (slots and a blocked __setattr__ need that).
        return (TokenCounts, (self.o200k_base, self.cl100k_base))


# The bodies leave out ``text``: the recorder stores it apart (possibly as a blob) and the record
# carries it as ``LedgerRecord.text``.


@dataclass(frozen=True, slots=True)
class SystemBody:
    """Instructions: everything is in the record's text."""


@dataclass(frozen=True, slots=True)
class UserInputBody:
    intent: UserIntent = "question"


@dataclass(frozen=True, slots=True)
class CallBody:
    """One tool call of an assistant message, as recorded."""

    call_id: str
    name: str
    args: Mapping[str, JsonValue]
    operation_id: str | None = None


@dataclass(frozen=True, slots=True)
class UsageBody:
    """What the provider reported for the call that produced a response (``CallUsage``)."""

    input_tokens: int
    output_tokens: int
    cost: float | None = None


@dataclass(frozen=True, slots=True)
class AssistantMessageBody:
    tool_calls: tuple[CallBody, ...] = ()
    purpose: Purpose = "action"
    usage: UsageBody | None = None


@dataclass(frozen=True, slots=True)
class ToolOutcomeBody:
    call_id: str
    status: ToolStatus = ToolStatus.SUCCESS
    external_ref: str | None = None


@dataclass(frozen=True, slots=True)
class ResourceBody:
    resource_id: str
    revision: str | None = None
    uri: str | None = None
    title: str | None = None


@dataclass(frozen=True, slots=True)
class ChildResultBody:
    child_instance_id: str
    status: ChildStatus = ChildStatus.COMPLETED
    conclusion: str = ""
    evidence_refs: tuple[str, ...] = ()
    artifact_refs: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunStatusBody:
    status: RunEnd
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ContextExportBody:
    # ``(thread_id, thread seq)`` of each exported parent record.
    refs: tuple[tuple[str, int], ...]
    note: str = ""
    # Set on the in-memory copy whose text already quotes the referenced records.
    resolved: bool = False


@dataclass(frozen=True, slots=True)
class ContextResetBody:
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StatePatchBody:
    # Ops stay JSON: the state projection (services/core/state.py) validates them against the contract.
    source: str
    ops: tuple[Mapping[str, JsonValue], ...]
    based_on_version: Mapping[str, int]
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OperationReconcileBody:
    operation_id: str
    status: Literal["success", "failed"]
    external_ref: str | None = None
    evidence: str = ""


@dataclass(frozen=True, slots=True)
class PhaseChangeBody:
    phase: str
    expected_steps: int | None = None
    source: Literal["runtime", "model_proposal"] = "runtime"


RecordBody: TypeAlias = (
    SystemBody
    | UserInputBody
    | AssistantMessageBody
    | ToolOutcomeBody
    | ResourceBody
    | ChildResultBody
    | RunStatusBody
    | ContextExportBody
    | ContextResetBody
    | StatePatchBody
    | OperationReconcileBody
    | PhaseChangeBody
)


def ascending_by_seq(records: Iterable[LedgerRecord]) -> bool:
    """Whether ``records`` come in strictly ascending seq order."""
    return all(a.seq < b.seq for a, b in itertools.pairwise(records))


def kind_of(event: Event) -> EventKind:
    """The record kind of a wire event: a new wire kind fails the type check here until it has one."""
    match event:
        case SystemEvent():
            return EventKind.SYSTEM
        case UserInputEvent():
            return EventKind.USER_INPUT
        case AssistantMessageEvent():
            return EventKind.ASSISTANT_MESSAGE
        case ToolOutcomeEvent():
            return EventKind.TOOL_OUTCOME
        case ResourceActivatedEvent():
            return EventKind.RESOURCE_ACTIVATED
        case ChildResultEvent():
            return EventKind.CHILD_RESULT
        case RunStatusEvent():
            return EventKind.RUN_STATUS
        case ContextExportEvent():
            return EventKind.CONTEXT_EXPORT
        case ContextResetEvent():
            return EventKind.CONTEXT_RESET
        case StatePatchEvent():
            return EventKind.STATE_PATCH
        case OperationReconcileEvent():
            return EventKind.OPERATION_RECONCILE
        case PhaseChangeEvent():
            return EventKind.PHASE_CHANGE
        case _:
            assert_never(event)


def parse_body(kind: EventKind, p: Mapping[str, JsonValue]) -> RecordBody:
    """The typed body of a stored payload (the recorder's ``model_dump(mode="json")`` without ``text``).

    Defaults are the wire models' own, so a payload that omits a defaulted field reads as it was sent.
    """
    match kind:
        case EventKind.SYSTEM:
            return SystemBody()
        case EventKind.USER_INPUT:
            return UserInputBody("supplement" if p.get("intent") == "supplement" else "question")
        case EventKind.ASSISTANT_MESSAGE:
            calls = p.get("tool_calls") or []
            usage = p.get("usage")
            return AssistantMessageBody(
                tuple(_call(c) for c in calls if isinstance(c, dict)) if isinstance(calls, list) else (),
                "completion" if p.get("purpose") == "completion" else "action",
                _usage(usage) if isinstance(usage, dict) else None,
            )
        case EventKind.TOOL_OUTCOME:
            return ToolOutcomeBody(
                _str(p, "call_id"), ToolStatus(_str(p, "status", "success")), _opt(p, "external_ref")
            )
        case EventKind.RESOURCE_ACTIVATED:
            return ResourceBody(_str(p, "resource_id"), _opt(p, "revision"), _opt(p, "uri"), _opt(p, "title"))
        case EventKind.CHILD_RESULT:
            return ChildResultBody(
                _str(p, "child_instance_id"),
                ChildStatus(_str(p, "status", "completed")),
                _str(p, "conclusion"),
                _strs(p, "evidence_refs"),
                _strs(p, "artifact_refs"),
                _strs(p, "unresolved"),
            )
        case EventKind.RUN_STATUS:
            status = p.get("status")
            end: RunEnd = status if status in ("failed", "cancelled", "interrupted") else "completed"  # type: ignore[assignment]
            return RunStatusBody(end, _str(p, "reason"))
        case EventKind.CONTEXT_EXPORT:
            refs = p.get("refs")
            pairs = tuple(
                (str(r["thread_id"]), int(str(r["seq"])))
                for r in (refs if isinstance(refs, list) else [])
                if isinstance(r, dict)
            )
            return ContextExportBody(pairs, _str(p, "note"), p.get("_resolved") is True)
        case EventKind.CONTEXT_RESET:
            return ContextResetBody(_str(p, "reason"))
        case EventKind.STATE_PATCH:
            ops = p.get("ops")
            versions = p.get("based_on_version")
            return StatePatchBody(
                _str(p, "source"),
                tuple(o for o in ops if isinstance(o, dict)) if isinstance(ops, list) else (),
                {str(k): int(str(v)) for k, v in versions.items()} if isinstance(versions, dict) else {},
                _strs(p, "evidence"),
            )
        case EventKind.OPERATION_RECONCILE:
            return OperationReconcileBody(
                _str(p, "operation_id"),
                "failed" if p.get("status") == "failed" else "success",
                _opt(p, "external_ref"),
                _str(p, "evidence"),
            )
        case EventKind.PHASE_CHANGE:
            steps = p.get("expected_steps")
            return PhaseChangeBody(
                _str(p, "phase"),
                steps if isinstance(steps, int) else None,
                "model_proposal" if p.get("source") == "model_proposal" else "runtime",
            )
        case _:
            assert_never(kind)


def _call(c: Mapping[str, JsonValue]) -> CallBody:
    args = c.get("args")
    return CallBody(
        _str(c, "call_id"), _str(c, "name"), args if isinstance(args, dict) else {}, _opt(c, "operation_id")
    )


def _usage(u: Mapping[str, JsonValue]) -> UsageBody:
    cost = u.get("cost")
    return UsageBody(
        _int(u, "input_tokens"),
        _int(u, "output_tokens"),
        float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
    )


def _int(p: Mapping[str, JsonValue], key: str) -> int:
    value = p.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def call_json(c: CallBody) -> dict[str, JsonValue]:
    """A call as the recorder stores it (``ToolCall.model_dump(mode="json")``):
    what ``parse_body`` reads back."""
    return {"call_id": c.call_id, "name": c.name, "args": dict(c.args), "operation_id": c.operation_id}


def _str(p: Mapping[str, JsonValue], key: str, default: str = "") -> str:
    value = p.get(key)
    return value if isinstance(value, str) else default


def _opt(p: Mapping[str, JsonValue], key: str) -> str | None:
    value = p.get(key)
    return value if isinstance(value, str) else None


def _strs(p: Mapping[str, JsonValue], key: str) -> tuple[str, ...]:
    value = p.get(key)
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """A record as the assembler reads it: model-visible text and the tokens counted at recording.

    ``payload`` is the stored JSON as the recorder wrote it; ``body`` is the same, typed, derived
    from it at construction (``dataclasses.replace`` derives it again, so the two never disagree).
    """

    seq: int
    event_key: str
    kind: EventKind
    payload: Mapping[str, JsonValue]
    text: str
    tokens: TokenCounts
    # A short preview of a long tool output and its tokens, shown when the hot path must shed tokens.
    mask_text: str | None = None
    mask_tokens: TokenCounts | None = None
    # Which thread wrote it, and its seq there; a view orders records by ``seq`` = session seq.
    thread_id: str = ""
    thread_seq: int = 0
    # When the fleet recorded it (its clock, ``recorded_at``); not part of what a model sees.
    recorded_at: datetime | None = field(default=None, compare=False)
    body: RecordBody = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen: the derived fields are set once, here. A kind given as its string value is accepted.
        kind = EventKind(self.kind)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "body", parse_body(kind, self.payload))
