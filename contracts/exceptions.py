"""The fleet's error tree. Each class carries its stable wire code and whether a retry can help.

::

    CtxError                         code, retryable=False
    ├── InvalidEvent                 dead-lettered with the raw payload; never retried
    │   ├── OrphanToolOutcome(call_id, thread_id)
    │   ├── DuplicateToolOutcome(call_id, first_seq)
    │   ├── DuplicateCallId(call_id)
    │   ├── ScopeViolation(thread_id, session_id, owner_session_id)
    │   │   └── ForeignSession(session_id)
    │   ├── ThreadMismatch(subject_thread, event_thread)
    │   ├── MsgIdMismatch(sent, expected)   a Nats-Msg-Id not derived from the event's bytes
    │   ├── EventKeyConflict(event_key, first_seq)
    │   ├── PayloadTooLarge(size, limit)     raised by the client before publishing
    │   ├── UnknownPolicy(name)
    │   ├── RunActive(session_id, active_run, run_id)
    │   ├── ReleaseMismatch(session_id, pinned, claimed)
    │   ├── UnknownInstance(thread_id, why)
    │   ├── GrantViolation(thread_id, ref_thread, ref_seq)
    │   ├── UnregisteredPath(path)
    │   ├── AuthorityViolation(pattern, kind, source)
    │   ├── StaleStateVersion(aggregate, expected, actual)
    │   ├── InvariantViolation(path, why)
    │   ├── OperationExists(operation_id)
    │   ├── UnknownOperation(operation_id)
    │   └── UnstorableEvent(stage, error, cause, sqlstate)   passed every check, yet storing it failed
    ├── DuplicateEvent(event_key)    internal: the caller treats it as success (idempotent ack)
    ├── RevisionConflict(thread_id, expected, actual)    retryable
    ├── StoreUnavailable(cause)      retryable
    ├── PositionRegressed(partition, committed, found)   retryable: re-read from the store's position
    ├── InvalidConfiguration(problems)   a process refusing to start: one line per bad setting
    ├── FleetUnavailable(cause)      retryable: no assembler answered, or NATS is unreachable
    ├── PermissionDenied(subject)    the broker refused this identity the subject: never retried
    ├── Overloaded(retry_after_ms, reason, limit)   retryable: refused at once, retry after the hint
    ├── IntegrityError(ref, actual)  stored content that no longer matches its hash
    ├── ContentNotFound(ref)         read-back of content the session cannot see
    ├── InvalidPolicy                a policy that fails validation
    ├── InvalidRequest               a request that cannot be served as asked
    │   ├── StoreRejected(error, sqlstate, cause)   values PostgreSQL refused (SQLSTATE 22/23/54)
    │   ├── UnknownModelProfile(name, known)
    │   ├── ThreadNotFound(thread_id)
    │   ├── SessionExists(session_id)     a fork naming a session id already in use
    │   ├── SeqOutOfRange(session_id, at_seq, last_seq)
    │   ├── ForkInsideToolGroup(session_id, at_seq, thread_id, call_ids)
    │   └── NotExportable(session_id, seq, what)   a record the trace format cannot carry
    ├── NotYetRecorded(thread_id, event_key, waited_ms)   retryable
    ├── EventRejected(event_key, rejected_code, reason)   refused, or its key holds another body
    ├── ContextBudgetExceeded(required, input_budget, items)
    │   └── OverBudget(total, input_budget, items, reductions)   over even with the oldest history dropped
    ├── TaskBudgetExhausted(thread_id, report)   a run's hard task budget is spent
    ├── ProviderContextExceeded(profile, view_revision, …)   the provider refused the same view twice
    ├── NothingToCompact(thread_id, reason)   a manual compaction found nothing the policy lets go
    ├── CompactionFailed(thread_id, stage, detail)   a manual compaction that did not commit
    ├── ProtectedBlockAltered(prepared_id, block_id, how, detail)   a final request lost a required block
    ├── AdditionRefused(prepared_id, reason, position, detail)   an addition unlabelled or ungranted
    ├── PreparedContextNotFound(prepared_id, format)   a final check of a context never prepared
    ├── HookChangeRefused(source, point, problems)   a hook asked for a change its point never allows
    ├── HookRejected(source, point, reason)
    ├── HookTimeout(source, point, timeout_ms)
    └── HookFailed(source, point, detail)   no valid reply: no responder, an error, a malformed answer

The store raises these same classes: ``services/store/_errors.py`` translates the driver's errors
into ``DuplicateEvent``, ``RevisionConflict``, ``StoreRejected`` and ``StoreUnavailable``.

Decode failures of raw bytes are ``contracts.EventDecodeError`` (the wire owns them); the recorder
dead-letters both kinds the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import JsonValue

from .errors import ErrorCode, ErrorReply
from .task_budgets import TaskBudgetReport

__all__ = [
    "HookChangeRefused",
    "HookFailed",
    "HookRejected",
    "HookTimeout",
    "AuthorityViolation",
    "BlockSize",
    "ContentNotFound",
    "ContextBudgetExceeded",
    "TaskBudgetExhausted",
    "CompactionFailed",
    "CtxError",
    "DuplicateCallId",
    "DuplicateEvent",
    "DuplicateToolOutcome",
    "EventKeyConflict",
    "EventRejected",
    "FleetUnavailable",
    "ForkInsideToolGroup",
    "GrantViolation",
    "IntegrityError",
    "InvalidConfiguration",
    "InvalidEvent",
    "InvariantViolation",
    "MsgIdMismatch",
    "NotExportable",
    "InvalidPolicy",
    "InvalidRequest",
    "NotYetRecorded",
    "NothingToCompact",
    "OverBudget",
    "OperationExists",
    "OrphanToolOutcome",
    "Overloaded",
    "PositionRegressed",
    "PermissionDenied",
    "PayloadTooLarge",
    "ProviderContextExceeded",
    "ProtectedBlockAltered",
    "AdditionRefused",
    "PreparedContextNotFound",
    "ReleaseMismatch",
    "RevisionConflict",
    "RunActive",
    "SeqOutOfRange",
    "SessionExists",
    "ScopeViolation",
    "StoreRejected",
    "ForeignSession",
    "StaleStateVersion",
    "StoreUnavailable",
    "ThreadMismatch",
    "ThreadNotFound",
    "UnknownInstance",
    "UnknownModelProfile",
    "UnknownOperation",
    "UnknownPolicy",
    "UnregisteredPath",
    "UnstorableEvent",
    "error_from_reply",
]


class CtxError(Exception):
    """Base of every fleet error."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    retryable: ClassVar[bool] = False
    # The message of a typed error, formatted from the fields its constructor hands to ``_say``.
    says: ClassVar[str] = ""

    def __init__(self, message: str, **details: JsonValue) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, JsonValue] = details

    def _say(self, unechoed: tuple[str, ...] = (), **fields: JsonValue) -> None:
        """Word ``says`` with ``fields`` and echo them in ``details``, all but ``unechoed`` (fields
        that only explain, or that must not leave the fleet)."""
        echoed = {name: value for name, value in fields.items() if name not in unechoed}
        CtxError.__init__(self, self.says.format(**fields), **echoed)

    def to_reply(self) -> ErrorReply:
        """The wire form of this error."""
        return ErrorReply(
            code=self.code, message=self.message, retryable=self.retryable, details=self.details
        )


class InvalidEvent(CtxError):
    """An event that decodes but may not enter the ledger."""

    code = ErrorCode.INVALID_EVENT


class OrphanToolOutcome(InvalidEvent):
    """A tool outcome whose call_id was never called in this thread."""

    code = ErrorCode.ORPHAN_TOOL_OUTCOME
    says = "tool_outcome for call_id {call_id!r}, which was never called in thread {thread_id}"

    def __init__(self, call_id: str, thread_id: str) -> None:
        self._say(call_id=call_id, thread_id=thread_id)


class DuplicateToolOutcome(InvalidEvent):
    """A second outcome, under a new event key, for a call that already has one."""

    code = ErrorCode.DUPLICATE_TOOL_OUTCOME
    says = "call {call_id!r} already has an outcome (record {first_seq})"

    def __init__(self, call_id: str, first_seq: int) -> None:
        self._say(call_id=call_id, first_seq=first_seq)


class DuplicateCallId(InvalidEvent):
    """An assistant message reusing a call_id already used in the thread (or twice in itself)."""

    code = ErrorCode.DUPLICATE_CALL_ID
    says = "call_id {call_id!r} is already used in this thread"

    def __init__(self, call_id: str) -> None:
        self._say(call_id=call_id)


class ScopeViolation(InvalidEvent):
    """An event claiming a thread that belongs to another session."""

    code = ErrorCode.SCOPE_VIOLATION
    says = (
        "thread {thread_id} belongs to another session; event claims session {session_id} "
        "(run ids are global, not per session: run {run} is already used — give this run a new id)"
    )

    def __init__(self, thread_id: str, session_id: str, owner_session_id: str) -> None:
        run = thread_id.split(".")[0]
        self._say(("run",), thread_id=thread_id, session_id=session_id, run=run)
        # The owner is not echoed on the wire: a dead letter must not leak another session's id.
        self.owner_session_id = owner_session_id


class ForeignSession(ScopeViolation):
    """An event naming a session that another tenant's first event created (a scope violation too)."""

    # Which tenant owns it is not said: a dead letter must not tell one tenant about another.
    says = "session {session_id} belongs to another tenant"

    def __init__(self, session_id: str) -> None:
        self._say(session_id=session_id)
        self.owner_session_id = ""


class ThreadMismatch(InvalidEvent):
    """An event published on the subject of one thread while naming another."""

    code = ErrorCode.THREAD_MISMATCH
    says = "published on thread {subject_thread} but the event names thread {event_thread}"

    def __init__(self, subject_thread: str, event_thread: str) -> None:
        self._say(subject_thread=subject_thread, event_thread=event_thread)


class MsgIdMismatch(InvalidEvent):
    """A ``Nats-Msg-Id`` header that is not ``thread/key/sha256[:16]`` of the event's bytes."""

    code = ErrorCode.MSG_ID_MISMATCH
    says = (
        "Nats-Msg-Id {sent!r} is not derived from this event (expected {expected!r}): "
        "JetStream would drop a later, different event under the same id as a duplicate; "
        "derive it as thread/key/sha256[:16]"
    )

    def __init__(self, sent: str, expected: str) -> None:
        self._say(sent=sent[:200], expected=expected)


class EventKeyConflict(InvalidEvent):
    """An event key reused in the same thread for different content."""

    code = ErrorCode.EVENT_KEY_CONFLICT
    says = "event key {event_key!r} was already recorded with different content"

    def __init__(self, event_key: str, first_seq: int | None) -> None:
        self._say(event_key=event_key, first_seq=first_seq)


class PayloadTooLarge(InvalidEvent):
    """An event bigger than the fleet (or the NATS server) accepts."""

    code = ErrorCode.PAYLOAD_TOO_LARGE
    says = "event is {size} bytes; the limit is {limit}"

    def __init__(self, size: int, limit: int) -> None:
        self._say(size=size, limit=limit)


class UnknownPolicy(InvalidEvent):
    """A session's first event names a policy that is not registered."""

    code = ErrorCode.UNKNOWN_POLICY
    says = "no policy named {name!r} is registered (ctxfleet policy set)"

    def __init__(self, name: str) -> None:
        self._say(name=name)


class RunActive(InvalidEvent):
    """A new question (or a resume) while another run of the session is active: wait or stop it."""

    code = ErrorCode.RUN_ACTIVE
    says = (
        "session {session_id} already has active run {active_run}; "
        "wait for it or stop it before starting {run_id}"
    )

    def __init__(self, session_id: str, active_run: str, run_id: str) -> None:
        self._say(session_id=session_id, active_run=active_run, run_id=run_id)


class ReleaseMismatch(InvalidEvent):
    """An event for a session pinned to another agent release: a new release opens a new session."""

    code = ErrorCode.RELEASE_MISMATCH
    says = "session {session_id} runs agent release {pinned}; start a new session for {claimed}"

    def __init__(self, session_id: str, pinned: str, claimed: str) -> None:
        self._say(session_id=session_id, pinned=pinned, claimed=claimed)


class UnknownInstance(InvalidEvent):
    """An instance the fleet cannot place: not a new run's main thread, and no known parent."""

    code = ErrorCode.UNKNOWN_INSTANCE
    says = "thread {thread_id}: {why}"

    def __init__(self, thread_id: str, why: str) -> None:
        self._say(("why",), thread_id=thread_id, why=why)


class GrantViolation(InvalidEvent):
    """A child referencing records beyond what its parent can grant."""

    code = ErrorCode.GRANT_VIOLATION
    says = "thread {thread_id} may not reference {ref_thread}#{ref_seq}: only its parent's recorded records"

    def __init__(self, thread_id: str, ref_thread: str, ref_seq: int) -> None:
        self._say(thread_id=thread_id, ref_thread=ref_thread, ref_seq=ref_seq)


class UnregisteredPath(InvalidEvent):
    """A patch writing a state path no catalog registers."""

    code = ErrorCode.UNREGISTERED_PATH
    says = "state path {path!r} is not registered for this release"

    def __init__(self, path: str) -> None:
        self._say(path=path)


class AuthorityViolation(InvalidEvent):
    """A writer the authority matrix does not allow for this kind of state."""

    code = ErrorCode.AUTHORITY_VIOLATION
    says = "{source} may not write {kind} state ({pattern})"

    def __init__(self, pattern: str, kind: str, source: str) -> None:
        self._say(pattern=pattern, kind=kind, source=source)


class StaleStateVersion(InvalidEvent):
    """A patch based on an aggregate version that has moved on."""

    code = ErrorCode.STALE_STATE_VERSION
    says = "aggregate {aggregate}: patch based on version {expected}, current is {actual}"

    def __init__(self, aggregate: str, expected: int, actual: int) -> None:
        self._say(aggregate=aggregate, expected=expected, actual=actual)


class InvariantViolation(InvalidEvent):
    """A patch operation that would break its path's invariant."""

    code = ErrorCode.INVARIANT_VIOLATION
    says = "{path}: {why}"

    def __init__(self, path: str, why: str) -> None:
        self._say(("why",), path=path, why=why)


class OperationExists(InvalidEvent):
    """A side-effecting call reusing an operation id: ask for its receipt instead of running it again."""

    code = ErrorCode.OPERATION_EXISTS
    says = "operation {operation_id!r} was already requested; ask ctx.operation.status before re-executing it"

    def __init__(self, operation_id: str) -> None:
        self._say(operation_id=operation_id)


class UnknownOperation(InvalidEvent):
    """A reconciliation naming an operation the session never requested."""

    code = ErrorCode.UNKNOWN_OPERATION
    says = "operation {operation_id!r} was never requested in this session"

    def __init__(self, operation_id: str) -> None:
        self._say(operation_id=operation_id)


class UnstorableEvent(InvalidEvent):
    """An event that passed every check, yet planning or storing it failed deterministically."""

    code = ErrorCode.UNSTORABLE_EVENT
    says = (
        "event could not be applied ({stage} failed with {error}: {cause}); "
        "set aside so its partition keeps recording"
    )

    def __init__(self, stage: str, error: str, cause: str, sqlstate: str | None = None) -> None:
        self._say(("cause",), stage=stage, error=error, cause=cause, sqlstate=sqlstate)


class DuplicateEvent(CtxError):
    """The event key is already recorded with the same content: a redelivery or a client retry."""

    code = ErrorCode.DUPLICATE_EVENT
    says = "event {event_key!r} is already recorded"

    def __init__(self, event_key: str) -> None:
        self._say(event_key=event_key)


class RevisionConflict(CtxError):
    """Another writer moved the thread head first; retry on fresh state."""

    code = ErrorCode.REVISION_CONFLICT
    retryable = True
    says = "thread {thread_id}: expected revision {expected}, found {actual}"

    def __init__(self, thread_id: str, expected: int, actual: int | None) -> None:
        self._say(thread_id=thread_id, expected=expected, actual=actual)


class StoreUnavailable(CtxError):
    """PostgreSQL could not be reached or dropped the connection."""

    code = ErrorCode.STORE_UNAVAILABLE
    retryable = True
    says = "store unavailable: {cause}"

    def __init__(self, cause: str) -> None:
        self._say(cause=cause)

    def to_reply(self) -> ErrorReply:
        """What a client is told: retry later. The cause names servers and driver errors, so it stays
        in the fleet's log (``workers.replies``)."""
        return ErrorReply(
            code=self.code, message="store unavailable: retry later", retryable=self.retryable, details={}
        )


class PositionRegressed(CtxError):
    """The store's position of a partition is behind what this recorder committed there: commits it
    made were lost (a PostgreSQL crash before they were flushed, a failover to a lagging replica), so
    what follows must be read again from the position the store holds."""

    code = ErrorCode.POSITION_REGRESSED
    retryable = True
    says = "partition {partition}: committed up to stream seq {committed}, the store holds {found}"

    def __init__(self, partition: int, committed: int, found: int) -> None:
        self._say(partition=partition, committed=committed, found=found)


class InvalidConfiguration(CtxError):
    """A setting is missing, malformed or contradicts another; the process does not start."""

    code = ErrorCode.INVALID_CONFIGURATION

    def __init__(self, problems: list[str]) -> None:
        super().__init__("bad configuration:\n  " + "\n  ".join(problems), problems=list(problems))
        self.problems = tuple(problems)


class FleetUnavailable(CtxError):
    """No fleet worker answered, or the broker cannot be reached."""

    code = ErrorCode.FLEET_UNAVAILABLE
    retryable = True
    says = "fleet unavailable: {cause}"

    def __init__(self, cause: str) -> None:
        self._say(cause=cause)


class PermissionDenied(CtxError):
    """The broker refused this connection's identity the subject (its grants do not include it)."""

    code = ErrorCode.PERMISSION_DENIED
    says = "permission denied: this NATS identity may not publish to {subject}"

    def __init__(self, subject: str) -> None:
        self._say(subject=subject)


class Overloaded(CtxError):
    """An assembler at its request limit refused the request at once; retry after ``retry_after_ms``."""

    code = ErrorCode.OVERLOADED
    retryable = True
    says = "assembler overloaded ({reason}, limit {limit} {limit_of}); retry after {retry_after_ms} ms"

    def __init__(
        self, retry_after_ms: int, reason: str, limit: int, *, limit_of: str = "requests in flight"
    ) -> None:
        self._say(("limit_of",), retry_after_ms=retry_after_ms, reason=reason, limit=limit, limit_of=limit_of)

    @property
    def retry_after_ms(self) -> int:
        """How long the caller should wait before retrying (also set on errors rebuilt from a reply)."""
        value = self.details.get("retry_after_ms")
        return value if isinstance(value, int) else 0


class IntegrityError(CtxError):
    """Stored content no longer matches its hash: it is never served."""

    code = ErrorCode.INTEGRITY_ERROR
    says = "{ref} fails its integrity check (content hashes to {actual})"

    def __init__(self, ref: str, actual: str) -> None:
        self._say(ref=ref, actual=actual)


class ContentNotFound(CtxError):
    """No record visible to the asking session references this content."""

    code = ErrorCode.NOT_FOUND
    says = "{ref} is not stored content of this session"

    def __init__(self, ref: str) -> None:
        self._say(ref=ref)


class InvalidPolicy(CtxError):
    """A policy that fails validation."""

    code = ErrorCode.INVALID_POLICY


class InvalidRequest(CtxError):
    """A request that cannot be served as asked."""

    code = ErrorCode.INVALID_REQUEST


class StoreRejected(InvalidRequest):
    """PostgreSQL refused the values sent (SQLSTATE class 22, 23 or 54): the same values fail again.

    ``details`` name the driver's error and its SQLSTATE, so a recorder can dead-letter the event at
    fault with them.
    """

    says = "the store refused the values ({error}, SQLSTATE {sqlstate}): {cause}"

    def __init__(self, error: str, sqlstate: str, cause: str) -> None:
        self._say(("cause",), error=error, sqlstate=sqlstate, cause=cause)
        self.cause = cause
        self.sqlstate = sqlstate

    def to_reply(self) -> ErrorReply:
        """What a client is told: which of its values were refused, in plain words. The driver's error
        and SQLSTATE stay in the fleet's log (``workers.replies``)."""
        reason = _REFUSED_BECAUSE.get(self.sqlstate[:2], "a value the store cannot hold")
        return ErrorReply(
            code=self.code,
            message=f"the store refused the request: {reason}",
            retryable=self.retryable,
            details={"refused": reason},
        )


# By SQLSTATE class (services/store/_errors.py CONTENT_SQLSTATE_CLASSES).
_REFUSED_BECAUSE = {
    "22": "a value out of range or in a form the store cannot hold",
    "23": "it conflicts with what is stored",
    "54": "it is too large for the store",
}


class UnknownModelProfile(InvalidRequest):
    """A model profile name the fleet does not know."""

    code = ErrorCode.UNKNOWN_MODEL_PROFILE
    says = "unknown model profile {name!r}; known: {listed}"

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        self._say(("listed",), name=name, known=list(known), listed=", ".join(known))


class ThreadNotFound(InvalidRequest):
    """No event of this thread has been recorded (or it is not visible to the asker)."""

    code = ErrorCode.THREAD_NOT_FOUND
    says = "thread {thread_id} has no recorded events"

    def __init__(self, thread_id: str) -> None:
        self._say(thread_id=thread_id)


class SessionExists(InvalidRequest):
    """A fork names a session id that is already in use (other than by this very fork)."""

    code = ErrorCode.SESSION_EXISTS
    says = "session {session_id} already exists; name the fork another id"

    def __init__(self, session_id: str) -> None:
        self._say(session_id=session_id)


class SeqOutOfRange(InvalidRequest):
    """A fork point outside the parent session's recorded seqs."""

    code = ErrorCode.SEQ_OUT_OF_RANGE
    says = "session {session_id} has records 1..{last_seq}; cannot fork at {at_seq}"

    def __init__(self, session_id: str, at_seq: int, last_seq: int) -> None:
        self._say(session_id=session_id, at_seq=at_seq, last_seq=last_seq)


class ForkInsideToolGroup(InvalidRequest):
    """A fork point between a tool call and its outcome: the fork would hold half a group."""

    code = ErrorCode.FORK_INSIDE_TOOL_GROUP

    def __init__(self, session_id: str, at_seq: int, thread_id: str, call_ids: list[str]) -> None:
        super().__init__(
            f"session {session_id} at seq {at_seq} has tool calls of {thread_id} without an outcome "
            f"({', '.join(call_ids)}); fork before the call or after its outcomes",
            session_id=session_id,
            at_seq=at_seq,
            thread_id=thread_id,
            call_ids=list(call_ids),
        )


class NotExportable(InvalidRequest):
    """A record the trace format cannot carry: exporting it would not replay back identically."""

    code = ErrorCode.NOT_EXPORTABLE
    says = "session {session_id} record {seq}: {what} has no form in the trace format"

    def __init__(self, session_id: str, seq: int, what: str) -> None:
        self._say(session_id=session_id, seq=seq, what=what)


class NotYetRecorded(CtxError):
    """The runtime's watermark event is not in the ledger yet; asking again later may succeed."""

    code = ErrorCode.NOT_YET_RECORDED
    retryable = True
    says = "event {event_key!r} of thread {thread_id} is not recorded after {waited_ms} ms"

    def __init__(self, thread_id: str, event_key: str, waited_ms: int) -> None:
        self._say(thread_id=thread_id, event_key=event_key, waited_ms=waited_ms)


class EventRejected(CtxError):
    """The runtime's watermark event will never be recorded: dead-lettered, or its key holds another body."""

    code = ErrorCode.EVENT_REJECTED
    says = "event {event_key!r} was rejected ({rejected_code}): {reason}"

    def __init__(self, event_key: str, rejected_code: str, reason: str) -> None:
        if rejected_code == ErrorCode.UNSTORABLE_EVENT.value:
            # That dead letter's reason quotes the store's own error: the operator's to read, not a client's.
            reason = "the fleet could not store it; an operator finds why in its dead letter"
        self._say(event_key=event_key, rejected_code=rejected_code, reason=reason)


BlockSize = dict[str, JsonValue]


class ContextBudgetExceeded(CtxError):
    """Required content alone does not fit the input budget; nothing required is dropped silently."""

    code = ErrorCode.CONTEXT_BUDGET_EXCEEDED
    says = "required content needs {required} tokens; the input budget is {input_budget}"

    def __init__(self, required: int, input_budget: int, items: list[BlockSize]) -> None:
        self._say(required=required, input_budget=input_budget, items=list(items))


class OverBudget(ContextBudgetExceeded):
    """The view does not fit even with the history awaiting compaction dropped: a context over budget."""

    says = "view needs {required} tokens after reductions; the input budget is {input_budget}"

    def __init__(
        self, total: int, input_budget: int, items: list[BlockSize], reductions: tuple[str, ...]
    ) -> None:
        self._say(required=total, input_budget=input_budget, items=list(items))
        self.total = total
        self.input_budget = input_budget
        self.items = items
        self.reductions = reductions


class TaskBudgetExhausted(CtxError):
    """A run's hard task budget is spent: no further context is prepared for it, never a truncated one."""

    code = ErrorCode.TASK_BUDGET_EXHAUSTED

    def __init__(self, thread_id: str, report: TaskBudgetReport) -> None:
        super().__init__(
            f"the task budget of {thread_id} is spent: {', '.join(report.exhausted)}",
            thread_id=thread_id,
            **report.model_dump(mode="json"),
        )


class ProviderContextExceeded(CtxError):
    """The provider refused a context of this view as too long again, after the fleet had already
    raised the profile's calibration and forced a compaction for it: shrinking once more on the same
    view would be a loop, so the runtime gets the figures (not retryable: the same view fails again).
    """

    code = ErrorCode.PROVIDER_CONTEXT_EXCEEDED

    def __init__(
        self,
        profile: str,
        view_revision: int,
        *,
        provider_limit: int | None,
        provider_count: int | None,
        our_estimate: int,
        calibration_factor: float,
    ) -> None:
        said = f"{provider_count} tokens" if provider_count is not None else "too many tokens"
        limit = f" (limit {provider_limit})" if provider_limit is not None else ""
        super().__init__(
            f"the provider refused view {view_revision} of profile {profile!r} twice: it counted {said}"
            f"{limit}, the fleet estimated {our_estimate}",
            profile=profile,
            view_revision=view_revision,
            provider_limit=provider_limit,
            provider_count=provider_count,
            our_estimate=our_estimate,
            calibration_factor=calibration_factor,
        )


class NothingToCompact(CtxError):
    """A manual compaction found no history the policy lets go (all of it is recent or required)."""

    code = ErrorCode.NOTHING_TO_COMPACT
    says = "nothing to compact in thread {thread_id}: {reason}"

    def __init__(self, thread_id: str, reason: str) -> None:
        self._say(thread_id=thread_id, reason=reason)


class CompactionFailed(CtxError):
    """A manual compaction ran but committed no summary (the summarizer failed, or no reduction)."""

    code = ErrorCode.COMPACTION_FAILED
    says = "compaction of thread {thread_id} failed at {stage}: {detail}"

    def __init__(self, thread_id: str, stage: str, detail: str) -> None:
        self._say(thread_id=thread_id, stage=stage, detail=detail)


class ProtectedBlockAltered(CtxError):
    """The request about to be sent lost, changed, reordered or downgraded a required block: never send it."""

    code = ErrorCode.CONTEXT_PROTECTED_BLOCK_ALTERED
    says = "protected block {block_id} of prepared context {prepared_id} is {how}: {detail}"

    def __init__(self, prepared_id: str, block_id: str, how: str, detail: str) -> None:
        self._say(("detail",), prepared_id=prepared_id, block_id=block_id, how=how, detail=detail)


class AdditionRefused(CtxError):
    """Added content that is unlabelled, not text, in an instruction's place or not granted to its source."""

    code = ErrorCode.CONTEXT_ADDITION_REFUSED
    says = "addition at unit {position} of the request for {prepared_id} refused ({reason}): {detail}"

    def __init__(self, prepared_id: str, reason: str, position: int, detail: str, **more: JsonValue) -> None:
        self._say(
            ("detail",), prepared_id=prepared_id, reason=reason, position=position, detail=detail, **more
        )


class PreparedContextNotFound(CtxError):
    """A final check names a prepared context this fleet does not know (for the asking tenant and thread)."""

    code = ErrorCode.PREPARED_CONTEXT_NOT_FOUND
    says = "no prepared context {prepared_id} in format {format} for this thread: prepare it again"

    def __init__(self, prepared_id: str, format: str) -> None:
        self._say(prepared_id=prepared_id, format=format)


class HookChangeRefused(CtxError):
    """A hook (policy fail) asked for a change its point never allows: the stage fails."""

    code = ErrorCode.HOOK_CHANGE_REFUSED
    says = "hook {source} at {point}: change refused: {listed}"

    def __init__(self, source: str, point: str, problems: Sequence[str]) -> None:
        self._say(
            ("listed",), source=source, point=point, problems=list(problems), listed="; ".join(problems)
        )


class HookRejected(CtxError):
    """A hook rejected the stage it ran in, with its reason."""

    code = ErrorCode.HOOK_REJECTED
    says = "hook {source} at {point} rejected: {reason}"

    def __init__(self, source: str, point: str, reason: str) -> None:
        self._say(source=source, point=point, reason=reason)


class HookTimeout(CtxError):
    """A hook (policy fail) did not answer within its timeout."""

    code = ErrorCode.HOOK_TIMEOUT
    says = "hook {source} at {point} did not answer within {timeout_ms} ms"

    def __init__(self, source: str, point: str, timeout_ms: int) -> None:
        self._say(source=source, point=point, timeout_ms=timeout_ms)


class HookFailed(CtxError):
    """A hook (policy fail) answered no valid reply (no responder, an error, a malformed answer)."""

    code = ErrorCode.HOOK_FAILED
    says = "hook {source} at {point} failed: {detail}"

    def __init__(self, source: str, point: str, detail: str) -> None:
        self._say(source=source, point=point, detail=detail)


_BY_CODE: dict[ErrorCode, type[CtxError]] = {}


def _index(cls: type[CtxError]) -> None:
    for sub in cls.__subclasses__():
        _BY_CODE.setdefault(sub.code, sub)
        _index(sub)


_index(CtxError)


def error_from_reply(reply: ErrorReply) -> CtxError:
    """Rebuild a typed error from its wire form, so clients can ``except NotYetRecorded``."""
    cls = _BY_CODE.get(reply.code, CtxError)
    err = cls.__new__(cls)
    CtxError.__init__(err, reply.message, **reply.details)
    return err
