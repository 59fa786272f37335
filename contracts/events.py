"""Events: what agent runtimes publish to ``ctx.events.<tenant>.<session>.<run>.<instance>``.

Every event is an envelope (who, where, which key) around one typed payload, discriminated by
``kind``. Runtimes in any language send the JSON form; :func:`decode_event` is the one place that
turns raw bytes into a typed event, and it raises ``EventDecodeError`` with a stable code.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeAlias, Union

from pydantic import (
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from ._base import SchemaVersion, Timestamp, TimestampOutOfRange, WireModel
from .errors import ErrorCode
from .ids import EventKeyStr, Identifier, ThreadId, thread_id_of
from .state import OperationReconcilePayload, StatePatchPayload
from .task_budgets import CallUsage, TaskBudget
from .wire_json import JSON_INT_MAX, JSON_INT_MIN, MAX_JSON_DEPTH, JsonProblem, WireJsonError, wire_loads

__all__ = [
    "EventKind",
    "content_identity",
    "content_sha256",
    "EVENT_KINDS",
    "JSON_INT_MAX",
    "JSON_INT_MIN",
    "MAX_JSON_DEPTH",
    "AssistantMessageEvent",
    "AssistantMessagePayload",
    "ChildResultEvent",
    "ChildResultPayload",
    "ChildStatus",
    "ContextExportEvent",
    "ContextExportPayload",
    "ContextResetEvent",
    "ContextResetPayload",
    "Event",
    "EventDecodeError",
    "ResourceActivatedEvent",
    "ResourceActivatedPayload",
    "RunStatusEvent",
    "RunStatusPayload",
    "OperationReconcileEvent",
    "PhaseChangeEvent",
    "PhaseChangePayload",
    "SourceRef",
    "StatePatchEvent",
    "SystemEvent",
    "SystemPayload",
    "ToolCall",
    "ToolOutcomeEvent",
    "ToolOutcomePayload",
    "ToolStatus",
    "UserInputEvent",
    "UserInputPayload",
    "decode_event",
]


class EventKind(StrEnum):
    """The kinds of event the wire carries: each event model's ``kind``, and each ledger record's."""

    SYSTEM = "system"
    USER_INPUT = "user_input"
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_OUTCOME = "tool_outcome"
    RESOURCE_ACTIVATED = "resource_activated"
    CHILD_RESULT = "child_result"
    RUN_STATUS = "run_status"
    CONTEXT_EXPORT = "context_export"
    CONTEXT_RESET = "context_reset"
    STATE_PATCH = "state_patch"
    OPERATION_RECONCILE = "operation_reconcile"
    PHASE_CHANGE = "phase_change"


class ToolStatus(StrEnum):
    """The real status of a tool call, as the tool runtime observed it."""

    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


class ChildStatus(StrEnum):
    """How a child agent's task ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ToolCall(WireModel):
    """One tool call inside an assistant message."""

    call_id: Annotated[str, Field(min_length=1, max_length=200)]
    name: Annotated[str, Field(min_length=1, max_length=200)]
    args: dict[str, JsonValue] = Field(default_factory=dict)
    # Set for side-effecting calls: the fleet keeps a receipt under it.
    operation_id: Annotated[str, Field(min_length=1, max_length=200)] | None = None


class SystemPayload(WireModel):
    """The agent's instructions: pinned and required in every prepared context."""

    text: str


class UserInputPayload(WireModel):
    """A question, answer or supplement from the user.

    ``intent`` says how it counts toward the ``user_turns`` trigger: a new question
    counts once; a supplement to a running question does not, though its tokens still count.
    """

    text: str
    intent: Literal["question", "supplement"] = "question"


class AssistantMessagePayload(WireModel):
    """A stored model response: text plus zero or more tool calls.

    Only ``action`` responses count as model steps; a ``completion`` check's answer is recorded
    but never counted (compaction calls are not recorded as messages at all).
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    purpose: Literal["action", "completion"] = "action"
    # What the provider reported for the call that produced this response; the task budget's ledger
    # uses it instead of its local estimate (never shown to a model).
    usage: CallUsage | None = None

    @model_serializer(mode="wrap")
    def _no_usage_as_before(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # Stored payloads and content hashes of responses without usage stay what they were.
        data: dict[str, object] = handler(self)
        if self.usage is None:
            data.pop("usage", None)
        return data


class ToolOutcomePayload(WireModel):
    """The result of one tool call, with its real status."""

    call_id: Annotated[str, Field(min_length=1, max_length=200)]
    status: ToolStatus = ToolStatus.SUCCESS
    text: str = ""
    # The external system's id of what the call did (order id, payment id), when it reports one.
    external_ref: str | None = None


class ResourceActivatedPayload(WireModel):
    """A loaded resource (skill body, file, document) that enters the context as material."""

    resource_id: Annotated[str, Field(min_length=1, max_length=500)]
    revision: str | None = None
    uri: str | None = None
    title: str | None = None
    text: str = ""


class ChildResultPayload(WireModel):
    """A child agent's typed result; it enters the parent as material, never as instruction."""

    child_instance_id: Identifier
    status: ChildStatus = ChildStatus.COMPLETED
    conclusion: str = ""
    evidence_refs: tuple[str, ...] = ()
    artifact_refs: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()


class RunStatusPayload(WireModel):
    """The runtime says how a run ended (or paused); a session has at most one active run."""

    status: Literal["completed", "failed", "cancelled", "interrupted"]
    reason: str = ""


class SourceRef(WireModel):
    """A record of another thread, by thread and thread seq."""

    thread_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}\.[A-Za-z0-9_-]{1,128}$")]
    seq: Annotated[int, Field(gt=0)]


class ContextExportPayload(WireModel):
    """What a parent explicitly hands a child as background: references, never copies."""

    refs: tuple[SourceRef, ...] = Field(min_length=1, max_length=500)
    note: str = ""


class ContextResetPayload(WireModel):
    """An explicit reset of the session's context: a new origin; raw history stays readable."""

    reason: str = ""


class PhaseChangePayload(WireModel):
    """The task moved to another phase, with the steps the phase is expected to take.

    A proposal the fleet weighs, never an instruction: from the runtime it may close the window at a
    safe boundary; from the model it is recorded and decides nothing (the model proposes, the runtime
    decides).
    """

    phase: Annotated[str, Field(min_length=1, max_length=100)]
    expected_steps: Annotated[int, Field(ge=1, le=100_000)] | None = None
    source: Literal["runtime", "model_proposal"] = "runtime"
    note: Annotated[str, Field(max_length=2_000)] = ""


def _kind_required(schema: dict[str, Any]) -> None:
    # On the wire every event names its kind (decode_event reads it first); only Python callers may
    # leave it to the class's default.
    schema["required"] = [*schema.get("required", ()), "kind"]


class _Envelope(WireModel):
    model_config = ConfigDict(json_schema_extra=_kind_required)

    schema_version: SchemaVersion = 1
    event_key: EventKeyStr
    session_id: Identifier
    # Run ids are global, not per session: a thread is (run_id, instance_id) fleet-wide, so a run id
    # another session already used is refused (scope_violation) — use a fresh id (a UUID) per run.
    run_id: Annotated[
        Identifier,
        Field(description="Unique across every session of the fleet (a thread is run_id.instance_id)."),
    ]
    instance_id: Identifier
    client_ts: Timestamp | None = None
    # Honoured on a session's first event only: the policy the whole session runs under.
    policy: Identifier | None = None
    # The principal the session belongs to, fixed by its first event; later events must match.
    principal_id: Identifier | None = None
    # The agent release the session runs, fixed by its first event: a new release is a new session.
    agent_release: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    # Honoured on a thread's first event: this instance is a child agent of that instance (same run).
    parent_instance_id: Identifier | None = None
    # Honoured on a run's first event only (its main thread's first): the budget the whole run
    # spends against, kept with the run; a prepare's own ``task_budget`` overrides it.
    task_budget: TaskBudget | None = None

    @model_serializer(mode="wrap")
    def _no_budget_as_before(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # Without a budget an event serializes as it did before budgets: a fleet that predates the
        # field (``extra="forbid"``) still takes it.
        data: dict[str, object] = handler(self)
        if self.task_budget is None:
            data.pop("task_budget", None)
        return data

    @property
    def thread_id(self) -> ThreadId:
        """The thread ``(run_id, instance_id)`` this event belongs to."""
        return thread_id_of(self.run_id, self.instance_id)


class SystemEvent(_Envelope):
    """Envelope of a ``system`` event."""

    kind: Literal["system"] = "system"
    payload: SystemPayload


class UserInputEvent(_Envelope):
    """Envelope of a ``user_input`` event."""

    kind: Literal["user_input"] = "user_input"
    payload: UserInputPayload


class AssistantMessageEvent(_Envelope):
    """Envelope of an ``assistant_message`` event."""

    kind: Literal["assistant_message"] = "assistant_message"
    payload: AssistantMessagePayload


class ToolOutcomeEvent(_Envelope):
    """Envelope of a ``tool_outcome`` event."""

    kind: Literal["tool_outcome"] = "tool_outcome"
    payload: ToolOutcomePayload


class ResourceActivatedEvent(_Envelope):
    """Envelope of a ``resource_activated`` event."""

    kind: Literal["resource_activated"] = "resource_activated"
    payload: ResourceActivatedPayload


class ChildResultEvent(_Envelope):
    """Envelope of a ``child_result`` event."""

    kind: Literal["child_result"] = "child_result"
    payload: ChildResultPayload


class RunStatusEvent(_Envelope):
    """Envelope of a ``run_status`` event."""

    kind: Literal["run_status"] = "run_status"
    payload: RunStatusPayload


class ContextExportEvent(_Envelope):
    """Envelope of a ``context_export`` event (published into the child's thread)."""

    kind: Literal["context_export"] = "context_export"
    payload: ContextExportPayload


class ContextResetEvent(_Envelope):
    """Envelope of a ``context_reset`` event."""

    kind: Literal["context_reset"] = "context_reset"
    payload: ContextResetPayload


class StatePatchEvent(_Envelope):
    """Envelope of a ``state_patch`` event: a typed patch from a user, the orchestrator or a model."""

    kind: Literal["state_patch"] = "state_patch"
    payload: StatePatchPayload


class OperationReconcileEvent(_Envelope):
    """Envelope of an ``operation_reconcile`` event."""

    kind: Literal["operation_reconcile"] = "operation_reconcile"
    payload: OperationReconcilePayload


class PhaseChangeEvent(_Envelope):
    """Envelope of a ``phase_change`` event."""

    kind: Literal["phase_change"] = "phase_change"
    payload: PhaseChangePayload


Event: TypeAlias = Annotated[
    Union[
        SystemEvent,
        UserInputEvent,
        AssistantMessageEvent,
        ToolOutcomeEvent,
        ResourceActivatedEvent,
        ChildResultEvent,
        RunStatusEvent,
        ContextExportEvent,
        ContextResetEvent,
        StatePatchEvent,
        OperationReconcileEvent,
        PhaseChangeEvent,
    ],
    Field(discriminator="kind"),
]

EVENT_KINDS: tuple[str, ...] = tuple(k.value for k in EventKind)

_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


class EventDecodeError(ValueError):
    """Raw bytes that are not a valid event; ``code`` says why, ``details`` where."""

    def __init__(self, code: ErrorCode, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details: dict[str, Any] = details or {}


def decode_event(raw: bytes, *, max_bytes: int) -> Event:
    """Decode one event from the wire, checking size, JSON, kind and fields in that order.

    The bytes must be JSON within the wire's fixed limits (:mod:`contracts.wire_json`), so that
    nothing accepted here can fail later in the planner or in PostgreSQL; ``details["limit"]`` names
    the limit an event broke:

    * not UTF-8, a lone surrogate escape such as ``\\ud800`` (text that is not Unicode), or U+0000
      in any string (PostgreSQL text cannot hold it, and the fleet refuses it rather than store an
      altered text) → ``invalid_encoding``;
    * a key twice in one object, a number that is not finite (``NaN``, ``Infinity``, a literal like
      ``1e999`` that overflows), an integer outside signed 64-bit, objects and arrays nested deeper
      than :data:`MAX_JSON_DEPTH` levels → ``invalid_event``;
    * ``client_ts`` outside years 1..9999 once converted to UTC → ``invalid_event``.

    Fields are validated strictly, as the event schema types them: ``"8000"`` is not an integer.

    Raises:
        EventDecodeError: with ``payload_too_large``, ``invalid_encoding``, ``malformed_json``,
            ``unknown_event_kind`` or ``invalid_event``.
    """
    if len(raw) > max_bytes:
        raise EventDecodeError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"event is {len(raw)} bytes; the limit is {max_bytes}",
            {"size": len(raw), "limit": max_bytes},
        )
    try:
        obj = wire_loads(raw)
    except WireJsonError as exc:
        raise EventDecodeError(
            _JSON_PROBLEM_CODES[exc.problem], f"event: {exc.message}", exc.details
        ) from None
    if not isinstance(obj, dict):
        raise EventDecodeError(ErrorCode.INVALID_EVENT, "an event is a JSON object")
    kind = _kind_of(obj)
    try:
        event = _EVENT_ADAPTER.validate_json(raw, strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        problems = [
            {"loc": ".".join(str(p) for p in err["loc"]), "type": err["type"], "msg": err["msg"]}
            for err in errors
        ]
        first = problems[0]
        if isinstance(errors[0].get("ctx", {}).get("error"), TimestampOutOfRange):
            # e.g. 0001-01-01T00:00:00+01:00: a valid RFC 3339 string whose UTC instant is in year 0.
            raise EventDecodeError(
                ErrorCode.INVALID_EVENT,
                "client_ts falls outside years 1..9999 once converted to UTC, which the ledger cannot store",
                {"limit": "client_ts_range"},
            ) from None
        raise EventDecodeError(
            ErrorCode.INVALID_EVENT,
            f"invalid {kind} event: {first['loc']}: {first['msg']}",
            {"errors": problems},
        ) from None
    return event


_JSON_PROBLEM_CODES: dict[JsonProblem, ErrorCode] = {
    "encoding": ErrorCode.INVALID_ENCODING,
    "syntax": ErrorCode.MALFORMED_JSON,
    "limit": ErrorCode.INVALID_EVENT,
}
# A kind named in a reason is cut to this many characters.
_KIND_CHARS = 100


def _kind_of(obj: dict[str, Any]) -> str:
    """The event's ``kind``, one of :data:`EVENT_KINDS`; else ``unknown_event_kind`` saying why."""
    known = f"known: {', '.join(EVENT_KINDS)}"
    if "kind" not in obj:
        raise EventDecodeError(
            ErrorCode.UNKNOWN_EVENT_KIND, f"missing field kind; {known}", {"missing": "kind"}
        )
    kind = obj["kind"]
    if not isinstance(kind, str):
        raise EventDecodeError(
            ErrorCode.UNKNOWN_EVENT_KIND,
            f"field kind must be a string, not {_json_type(kind)}; {known}",
            {"type": _json_type(kind)},
        )
    if kind not in EVENT_KINDS:
        raise EventDecodeError(
            ErrorCode.UNKNOWN_EVENT_KIND,
            f"unknown event kind {kind[:_KIND_CHARS]!r}; {known}",
            {"kind": kind[:_KIND_CHARS]},
        )
    return kind


def _json_type(value: object) -> str:
    """The JSON type of a decoded value other than a string."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "array" if isinstance(value, list) else "object"


def content_identity(event: Event) -> dict[str, JsonValue]:
    """What an event's content hash covers: its identity and its full content."""
    identity: dict[str, JsonValue] = {
        "event_key": event.event_key,
        "session_id": event.session_id,
        "run_id": event.run_id,
        "instance_id": event.instance_id,
        "kind": event.kind,
        "client_ts": event.client_ts.isoformat() if event.client_ts else None,
        "payload": event.payload.model_dump(mode="json"),
        "policy": event.policy,
        "principal_id": event.principal_id,
        "agent_release": event.agent_release,
        "parent_instance_id": event.parent_instance_id,
    }
    if event.task_budget is not None:
        # Only when declared: events recorded before task budgets keep their content hash.
        identity["task_budget"] = event.task_budget.model_dump(mode="json")
    return identity


def content_sha256(event: Event) -> str:
    """The content hash the ledger records for ``event`` (``content_sha256``), which
    ``PrepareRequest.after_event_hash`` names: the SHA-256 of its ``content_identity`` as canonical
    JSON (sorted keys, no whitespace, UTF-8). Two bodies under one key are the same event exactly when
    their hashes are equal, so a prepare naming its event by this hash learns at once of a key reused
    for other content."""
    text = json.dumps(content_identity(event), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
