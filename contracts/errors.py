"""Error codes and the error messages that travel on the wire.

Codes are stable strings: runtimes branch on them, dashboards count them. Never rename one;
add a new code instead.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, JsonValue

from ._base import SchemaVersion, WireModel

__all__ = ["DeadLetter", "ErrorCode", "ErrorReply"]


class ErrorCode(StrEnum):
    """Every error the fleet reports, by stable code."""

    # Bad events: dead-lettered with the raw payload, never retried.
    INVALID_EVENT = "invalid_event"
    UNKNOWN_EVENT_KIND = "unknown_event_kind"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    INVALID_ENCODING = "invalid_encoding"
    MALFORMED_JSON = "malformed_json"
    THREAD_MISMATCH = "thread_mismatch"
    ORPHAN_TOOL_OUTCOME = "orphan_tool_outcome"
    DUPLICATE_TOOL_OUTCOME = "duplicate_tool_outcome"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    SCOPE_VIOLATION = "scope_violation"
    EVENT_KEY_CONFLICT = "event_key_conflict"
    MSG_ID_MISMATCH = "msg_id_mismatch"
    UNKNOWN_POLICY = "unknown_policy"
    RUN_ACTIVE = "run_active"
    RELEASE_MISMATCH = "release_mismatch"
    UNREGISTERED_PATH = "unregistered_path"
    AUTHORITY_VIOLATION = "authority_violation"
    STALE_STATE_VERSION = "stale_state_version"
    INVARIANT_VIOLATION = "invariant_violation"
    OPERATION_EXISTS = "operation_exists"
    UNKNOWN_OPERATION = "unknown_operation"
    GRANT_VIOLATION = "grant_violation"
    UNKNOWN_INSTANCE = "unknown_instance"
    # Passed every check yet the planner or PostgreSQL could not apply it (the recorder's safety net).
    UNSTORABLE_EVENT = "unstorable_event"
    # Internal, treated as success by the caller.
    DUPLICATE_EVENT = "duplicate_event"
    # Concurrency and infrastructure: retryable.
    REVISION_CONFLICT = "revision_conflict"
    STORE_UNAVAILABLE = "store_unavailable"
    # The store holds an older position than its recorder committed: re-read from there.
    POSITION_REGRESSED = "position_regressed"
    FLEET_UNAVAILABLE = "fleet_unavailable"
    OVERLOADED = "overloaded"
    PERMISSION_DENIED = "permission_denied"
    # Requests.
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_MODEL_PROFILE = "unknown_model_profile"
    THREAD_NOT_FOUND = "thread_not_found"
    NOT_YET_RECORDED = "not_yet_recorded"
    EVENT_REJECTED = "event_rejected"
    CONTEXT_BUDGET_EXCEEDED = "context_budget_exceeded"
    TASK_BUDGET_EXHAUSTED = "task_budget_exhausted"
    # The provider refused a context as too long a second time on the same view.
    PROVIDER_CONTEXT_EXCEEDED = "provider_context_exceeded"
    # A manual compaction (ctx.compact) that found nothing the policy lets go, or did not commit.
    NOTHING_TO_COMPACT = "nothing_to_compact"
    COMPACTION_FAILED = "compaction_failed"
    INVALID_POLICY = "invalid_policy"
    INTEGRITY_ERROR = "integrity_error"
    NOT_FOUND = "not_found"
    INVALID_CONFIGURATION = "invalid_configuration"
    # Branches: forking a session, exporting it as a trace.
    SESSION_EXISTS = "session_exists"
    SEQ_OUT_OF_RANGE = "seq_out_of_range"
    FORK_INSIDE_TOOL_GROUP = "fork_inside_tool_group"
    NOT_EXPORTABLE = "not_exportable"
    # The gateway's final check (ctx.gateway.check): the request about to be sent is not the prepared one.
    CONTEXT_PROTECTED_BLOCK_ALTERED = "context_protected_block_altered"
    CONTEXT_ADDITION_REFUSED = "context_addition_refused"
    PREPARED_CONTEXT_NOT_FOUND = "prepared_context_not_found"
    # Context hooks: a hook's change outside what its point allows, its reject, its failure.
    HOOK_CHANGE_REFUSED = "hook_change_refused"
    HOOK_REJECTED = "hook_rejected"
    HOOK_TIMEOUT = "hook_timeout"
    HOOK_FAILED = "hook_failed"
    INTERNAL = "internal_error"


class ErrorReply(WireModel):
    """The reply to a request that failed; ``code`` is stable, ``details`` typed per code."""

    schema_version: SchemaVersion = 1
    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    retryable: bool = False
    details: dict[str, JsonValue] = Field(default_factory=dict)


class DeadLetter(WireModel):
    """A rejected event with its reason and raw payload, published to ``ctx.dead.events.<thread>``.

    The raw payload is kept whole (base64) up to ``raw_kept_bytes``; larger payloads (those over the
    size limit) keep their head, with the full size and sha256 so the sender can find them.
    """

    schema_version: SchemaVersion = 1
    code: ErrorCode
    reason: str
    details: dict[str, JsonValue] = Field(default_factory=dict)
    subject: str
    thread_id: str | None = None
    event_key: str | None = None
    stream_seq: int
    raw_size: int
    raw_sha256: str
    raw_base64: str
    raw_truncated: bool
