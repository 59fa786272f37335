"""Recording: turn a fetched batch of raw event messages into ledger writes, with no I/O.

Two pure steps around one read: :func:`decode_batch` reads the raw messages; the store then loads
what those events touch (thread heads, already-recorded keys, tool-call states); :func:`plan_batch`
decides every write and every rejection. The invariants it enforces, one check each:

1. An event is decodable, within the size limit, valid UTF-8 and within the wire's JSON limits
   (finite numbers, 64-bit integers, bounded depth, no NUL or lone surrogate: ``decode_event``).
2. The event names the thread of the subject it was published on (``_check_subject``), and a
   ``Nats-Msg-Id`` it carries is derived from its bytes (``_check_msg_id``).
3. A session belongs to exactly one tenant — the one on the subject of its first event, which the
   server's permissions vouch for (``_check_tenant``) — and a thread to exactly one session,
   pinned by its first event (``_check_scope``).
4. An event key is recorded once per thread; a redelivery with the same content is a no-op, the
   same key with other content is rejected (``_check_key``).
5. A tool outcome answers a call of its own thread that has no outcome yet (``_check_outcome``).
6. A call id is used once per thread (``_check_calls``).
7. Records of a thread get consecutive seqs and chain their hashes; seqs follow stream order.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import assert_never

from pydantic import JsonValue

from contracts import (
    DEFAULT_POLICY_NAME,
    PatchOp,
    ToolCatalog,
    AssistantMessageEvent,
    ChildResultEvent,
    ContextExportEvent,
    ContextResetEvent,
    ErrorCode,
    Event,
    EventDecodeError,
    ResourceActivatedEvent,
    OperationReconcileEvent,
    RunStatusEvent,
    StatePatchEvent,
    SystemEvent,
    ToolOutcomeEvent,
    ToolStatus,
    UserInputEvent,
    decode_event,
)
from contracts.subjects import msg_id_of, parse_stored_subject

from .errors import (
    MsgIdMismatch,
    DuplicateCallId,
    DuplicateToolOutcome,
    EventKeyConflict,
    ForeignSession,
    InvalidEvent,
    OrphanToolOutcome,
    ScopeViolation,
    ThreadMismatch,
    UnknownPolicy,
    OperationExists,
    UnknownOperation,
)
from .hashing import GENESIS_HASH, canonical_json, chain_hash, sha256_hex
from .runs import Lifecycle, RunState, ThreadMeta
from .state import StateView, StateWrite, effects_of, plan_patch, tool_spec
from .counting import is_model_step, is_new_question
from .render import RenderedCall, TokenCounts, arguments_json, content_of, count_record, telling_line, trim_tool_text
from .tokens import EncodingName, TokenCounter

__all__ = [
    "BatchPlan",
    "Blob",
    "CallState",
    "Decoded",
    "HeadWrite",
    "Incoming",
    "KnownKey",
    "LedgerReads",
    "NewCall",
    "NewOutcome",
    "NewRecord",
    "RecordingLimits",
    "Rejection",
    "ThreadHead",
    "blob_ref",
    "decode_batch",
    "encode_raw",
    "plan_batch",
]


@dataclass(frozen=True, slots=True)
class Incoming:
    """One message as fetched from the events stream."""

    subject: str
    data: bytes
    stream_seq: int
    # The publisher's ``Nats-Msg-Id``; ``None`` when it sent none (then only Postgres dedups).
    msg_id: str | None = None


@dataclass(frozen=True, slots=True)
class RecordingLimits:
    """The recorder's configurable limits."""

    max_event_bytes: int = 8 * 1024 * 1024
    blob_min_bytes: int = 4096
    tool_result_max_tokens: int = 2000
    dead_letter_keep_bytes: int = 256 * 1024
    mask_min_chars: int = 800


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded event with where it came from."""

    incoming: Incoming
    subject_thread: str
    event: Event
    # The tenant of the subject the server stored it under: who published it, not what it claims.
    tenant: str


@dataclass(frozen=True, slots=True)
class Rejection:
    """An event that goes to the dead-letter subject instead of the ledger."""

    incoming: Incoming
    thread_id: str | None
    event_key: str | None
    code: ErrorCode
    reason: str
    details: dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class ThreadHead:
    """The current head of a thread, as read before the batch."""

    thread_id: str
    session_id: str
    revision: int
    last_seq: int
    last_hash: str
    last_event_key: str | None


@dataclass(frozen=True, slots=True)
class KnownKey:
    """An event key already in the ledger."""

    seq: int
    content_sha256: str


@dataclass(frozen=True, slots=True)
class CallState:
    """A tool call already in the ledger and whether it has its outcome."""

    call_id: str
    call_seq: int
    outcome_seq: int | None
    name: str = ""
    args: Mapping[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LedgerReads:
    """What the store read for a batch: keyed by thread id, and (thread id, key or call id)."""

    heads: Mapping[str, ThreadHead]
    keys: Mapping[tuple[str, str], KnownKey]
    calls: Mapping[tuple[str, str], CallState]
    # The tenant of every known session the batch names.
    sessions: Mapping[str, str] = field(default_factory=dict)
    # (tenant, name) of registered policies; tenant ``""`` is a built-in every tenant may name.
    policies: frozenset[tuple[str, str]] = frozenset({("", DEFAULT_POLICY_NAME)})
    runs: Mapping[str, RunState] = field(default_factory=dict)
    active_runs: Mapping[str, str] = field(default_factory=dict)
    threads: Mapping[str, ThreadMeta] = field(default_factory=dict)
    principals: Mapping[str, str | None] = field(default_factory=dict)
    releases: Mapping[str, str | None] = field(default_factory=dict)
    states: Mapping[str, StateView] = field(default_factory=dict)
    catalogs: Mapping[str, tuple[int, ToolCatalog]] = field(default_factory=dict)
    # The newest catalog of each (tenant, release) the batch names.
    latest_catalogs: Mapping[tuple[str, str], tuple[int, ToolCatalog]] = field(default_factory=dict)
    operations: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Blob:
    """Large content, stored once under its sha256."""

    sha256: str
    content: bytes


@dataclass(frozen=True, slots=True)
class NewRecord:
    """One row to append to the ledger."""

    thread_id: str
    seq: int
    session_id: str
    session_ordinal: int
    run_id: str
    instance_id: str
    event_key: str
    kind: str
    payload_json: str
    text: str | None
    blob_sha256: str | None
    view_text: str | None
    tokens: TokenCounts
    mask_text: str | None
    mask_tokens: TokenCounts | None
    content_sha256: str
    prev_hash: str
    record_hash: str
    client_ts: datetime | None
    stream_seq: int


@dataclass(frozen=True, slots=True)
class HeadWrite:
    """The new head of a thread; ``expected_revision`` is ``None`` for a thread's first batch."""

    thread_id: str
    session_id: str
    run_id: str
    instance_id: str
    expected_revision: int | None
    revision: int
    last_seq: int
    last_hash: str
    last_event_key: str
    user_turns: int = 0
    model_steps: int = 0


@dataclass(frozen=True, slots=True)
class NewCall:
    """A tool call opened by a recorded assistant message."""

    thread_id: str
    call_id: str
    name: str
    call_seq: int
    args: Mapping[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NewOutcome:
    """A tool call closed by a recorded outcome."""

    thread_id: str
    call_id: str
    outcome_seq: int
    status: str


@dataclass(frozen=True)
class BatchPlan:
    """Every write a batch makes, decided before any of them happens."""

    records: tuple[NewRecord, ...] = ()
    blobs: tuple[Blob, ...] = ()
    heads: tuple[HeadWrite, ...] = ()
    calls: tuple[NewCall, ...] = ()
    outcomes: tuple[NewOutcome, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    duplicates: tuple[tuple[str, str], ...] = ()
    session_counts: Mapping[str, int] = field(default_factory=dict)
    # The policy and tenant of each session the batch creates.
    session_policies: Mapping[str, str] = field(default_factory=dict)
    session_tenants: Mapping[str, str] = field(default_factory=dict)
    new_runs: tuple[RunState, ...] = ()
    run_statuses: Mapping[str, str] = field(default_factory=dict)
    new_threads: Mapping[str, ThreadMeta] = field(default_factory=dict)
    principals: Mapping[str, str] = field(default_factory=dict)
    releases: Mapping[str, str] = field(default_factory=dict)
    resets: tuple[tuple[str, str, int], ...] = ()
    state_writes: tuple[tuple[str, int, str, StateWrite, tuple[PatchOp, ...]], ...] = ()
    session_catalogs: Mapping[str, int] = field(default_factory=dict)
    receipts_requested: tuple[tuple[str, str, str, str, str, str, str], ...] = ()
    receipts_finished: tuple[tuple[str, str, str, str, str, str | None], ...] = ()
    receipts_reconciled: tuple[tuple[str, str, str, str | None, str], ...] = ()


def blob_ref(sha256: str) -> str:
    """The reference by which stored content can be read back."""
    return f"ctx://blob/{sha256}"


def decode_batch(batch: Sequence[Incoming], limits: RecordingLimits) -> list[Decoded | Rejection]:
    """Decode each message (invariants 1 and 2); order is kept."""
    out: list[Decoded | Rejection] = []
    for incoming in batch:
        stored = parse_stored_subject(incoming.subject)
        subject_thread = stored.thread_id if stored else None
        subject_session = stored.session_id if stored else None
        try:
            event = decode_event(incoming.data, max_bytes=limits.max_event_bytes)
        except EventDecodeError as exc:
            out.append(Rejection(incoming, subject_thread, None, exc.code, exc.message, exc.details))
            continue
        try:
            _check_subject(subject_thread, event)
            _check_subject_session(subject_session, event)
            _check_msg_id(incoming, event)
        except InvalidEvent as exc:
            out.append(_reject(incoming, event, exc))
            continue
        assert stored is not None
        out.append(Decoded(incoming, stored.thread_id, event, stored.tenant))
    return out


def _reject(incoming: Incoming, event: Event, exc: InvalidEvent) -> Rejection:
    return Rejection(incoming, event.thread_id, event.event_key, exc.code, exc.message, exc.details)


def _check_subject(subject_thread: str | None, event: Event) -> None:
    if subject_thread != event.thread_id:
        raise ThreadMismatch(subject_thread or "?", event.thread_id)


def _check_msg_id(incoming: Incoming, event: Event) -> None:
    # JetStream deduplicates by this header before we see anything: an id not derived from the bytes
    # would let a later, different event under it vanish as a "duplicate" with no dead letter.
    if incoming.msg_id is None:
        return
    expected = msg_id_of(event.thread_id, event.event_key, incoming.data)
    if incoming.msg_id != expected:
        raise MsgIdMismatch(incoming.msg_id, expected)


def _check_subject_session(subject_session: str | None, event: Event) -> None:
    # The subject routes by session: an event filed under another session would escape its order.
    if subject_session != event.session_id:
        raise ThreadMismatch(f"{subject_session}/{event.thread_id}", f"{event.session_id}/{event.thread_id}")


@dataclass
class _ThreadCursor:
    thread_id: str
    session_id: str
    run_id: str
    instance_id: str
    expected_revision: int | None
    seq: int
    last_hash: str
    last_event_key: str | None
    dirty: bool = False
    user_turns: int = 0
    model_steps: int = 0


def plan_batch(
    decoded: Sequence[Decoded | Rejection],
    reads: LedgerReads,
    limits: RecordingLimits,
    counters: Mapping[EncodingName, TokenCounter],
) -> BatchPlan:
    """Decide the records, heads, blobs, call states and rejections of a decoded batch."""
    cursors: dict[str, _ThreadCursor] = {}
    keys: dict[tuple[str, str], KnownKey] = dict(reads.keys)
    calls: dict[tuple[str, str], CallState] = dict(reads.calls)
    records: list[NewRecord] = []
    blobs: dict[str, Blob] = {}
    new_calls: list[NewCall] = []
    outcomes: list[NewOutcome] = []
    rejections: list[Rejection] = []
    duplicates: list[tuple[str, str]] = []
    session_counts: dict[str, int] = {}
    session_policies: dict[str, str] = {}
    tenants: dict[str, str] = dict(reads.sessions)
    life = Lifecycle.from_reads(reads.runs, reads.active_runs, reads.threads, reads.principals, reads.releases)
    releases: dict[str, str] = {}
    states: dict[str, StateView] = {}
    catalogs: dict[str, tuple[int, ToolCatalog]] = dict(reads.catalogs)
    session_catalogs: dict[str, int] = {}
    state_writes: list[tuple[str, int, str, StateWrite, tuple[PatchOp, ...]]] = []
    operations: set[tuple[str, str]] = set(reads.operations)
    requested: list[tuple[str, str, str, str, str, str, str]] = []
    finished: list[tuple[str, str, str, str, str, str | None]] = []
    reconciled: list[tuple[str, str, str, str | None, str]] = []
    new_runs: list[RunState] = []
    run_statuses: dict[str, str] = {}
    new_threads: dict[str, ThreadMeta] = {}
    principals: dict[str, str] = {}
    resets: list[tuple[str, str, int]] = []

    for item in decoded:
        if isinstance(item, Rejection):
            rejections.append(item)
            continue
        event = item.event
        thread_id = item.subject_thread
        cursor = cursors.get(thread_id) or _open_cursor(thread_id, event, reads.heads.get(thread_id))
        content_sha = sha256_hex(canonical_json(_identity_and_content(event)))
        try:
            _check_tenant(item.tenant, event.session_id, tenants)
            _check_scope(cursor, event)
            if _check_key(keys.get((thread_id, event.event_key)), event.event_key, content_sha):
                duplicates.append((thread_id, event.event_key))
                continue
            _check_outcome(event, thread_id, calls)
            _check_calls(event, thread_id, calls)
            policy = _check_policy(event, item.tenant, reads, session_policies)
            known = event.session_id in reads.sessions or event.session_id in session_policies
            change = life.check(event, thread_id, session_known=known)
            release = (item.tenant, event.agent_release or "")
            if not known and event.agent_release and release in reads.latest_catalogs:
                catalogs.setdefault(event.session_id, reads.latest_catalogs[release])
            _check_operations(event, operations)
            _check_reconcile(event, operations)
            state = states.setdefault(thread_id, _copy_state(reads.states.get(thread_id)))
            write = _state_write(event, state, catalogs.get(event.session_id), calls, thread_id, cursor.seq + 1)
        except InvalidEvent as exc:
            rejections.append(_reject(item.incoming, event, exc))
            continue

        cursors[thread_id] = cursor
        if policy is not None:
            session_policies[event.session_id] = policy
            tenants[event.session_id] = item.tenant
        life.apply(change)
        if change.new_run is not None:
            new_runs.append(change.new_run)
        if change.new_thread is not None:
            new_threads[thread_id] = change.new_thread
        if change.run_status is not None:
            run_statuses[change.run_status[0]] = change.run_status[1]
        if change.principal is not None:
            principals[change.principal[0]] = change.principal[1]
        if change.release is not None:
            releases[change.release[0]] = change.release[1]
            if event.session_id in catalogs and event.session_id not in reads.catalogs:
                session_catalogs[event.session_id] = catalogs[event.session_id][0]
        _note_receipts(event, thread_id, operations, requested, finished)
        if isinstance(event, OperationReconcileEvent):
            p = event.payload
            reconciled.append((event.session_id, p.operation_id, p.status, p.external_ref, event.event_key))
        if write is not None:
            state.apply(write[0])
            state_writes.append((thread_id, cursor.seq + 1, event.event_key, write[0], write[1]))
        cursor.user_turns += _counts_as_turn(event)
        cursor.model_steps += _counts_as_step(event)
        seq = cursor.seq + 1
        record, blob_list = _build_record(item, cursor, seq, content_sha, limits, counters)
        session_counts[cursor.session_id] = session_counts.get(cursor.session_id, 0) + 1
        record = _with_session_ordinal(record, session_counts[cursor.session_id])
        records.append(record)
        for blob in blob_list:
            blobs.setdefault(blob.sha256, blob)
        keys[(thread_id, event.event_key)] = KnownKey(seq, content_sha)
        cursor.seq, cursor.last_hash, cursor.last_event_key, cursor.dirty = (
            seq,
            record.record_hash,
            event.event_key,
            True,
        )
        _note_calls(event, thread_id, seq, calls, new_calls, outcomes)
        if change.reset_session is not None:
            resets.append((change.reset_session, thread_id, seq))
        meta = life.threads.get(thread_id)
        if meta is not None:
            life.threads[thread_id] = ThreadMeta(meta.thread_id, meta.session_id, meta.role, meta.parent_thread_id, seq)

    heads = tuple(
        HeadWrite(
            thread_id=c.thread_id,
            session_id=c.session_id,
            run_id=c.run_id,
            instance_id=c.instance_id,
            expected_revision=c.expected_revision,
            revision=(c.expected_revision or 0) + 1,
            last_seq=c.seq,
            last_hash=c.last_hash,
            last_event_key=c.last_event_key or "",
            user_turns=c.user_turns,
            model_steps=c.model_steps,
        )
        for c in cursors.values()
        if c.dirty
    )
    return BatchPlan(
        records=tuple(records),
        blobs=tuple(blobs.values()),
        heads=heads,
        calls=tuple(new_calls),
        outcomes=tuple(outcomes),
        rejections=tuple(rejections),
        duplicates=tuple(duplicates),
        session_counts=session_counts,
        session_policies=session_policies,
        session_tenants={s: tenants[s] for s in session_policies},
        new_runs=tuple(new_runs),
        run_statuses=run_statuses,
        new_threads=new_threads,
        principals=principals,
        releases=releases,
        resets=tuple(resets),
        state_writes=tuple(state_writes),
        session_catalogs=session_catalogs,
        receipts_requested=tuple(requested),
        receipts_finished=tuple(finished),
        receipts_reconciled=tuple(reconciled),
    )


def _check_operations(event: Event, operations: set[tuple[str, str]]) -> None:
    """An operation id is executed once per session: a second request must ask for its status."""
    if not isinstance(event, AssistantMessageEvent):
        return
    seen: set[str] = set()
    for call in event.payload.tool_calls:
        op = call.operation_id
        if op is None:
            continue
        if (event.session_id, op) in operations or op in seen:
            raise OperationExists(op)
        seen.add(op)


def _check_reconcile(event: Event, operations: set[tuple[str, str]]) -> None:
    """Only the orchestrator's own event settles an operation, and only one that exists."""
    if isinstance(event, OperationReconcileEvent) and (event.session_id, event.payload.operation_id) not in operations:
        raise UnknownOperation(event.payload.operation_id)


_RECEIPT_STATUS = {"success": "success", "error": "failed", "timeout": "timeout", "unknown": "unknown"}


def _note_receipts(
    event: Event,
    thread_id: str,
    operations: set[tuple[str, str]],
    requested: list[tuple[str, str, str, str, str, str, str]],
    finished: list[tuple[str, str, str, str, str, str | None]],
) -> None:
    if isinstance(event, AssistantMessageEvent):
        for call in event.payload.tool_calls:
            if call.operation_id is None:
                continue
            digest = sha256_hex(canonical_json({"tool": call.name, "args": call.args}))
            operations.add((event.session_id, call.operation_id))
            requested.append((event.session_id, call.operation_id, thread_id, call.call_id, call.name, digest, event.event_key))
    elif isinstance(event, ToolOutcomeEvent):
        p = event.payload
        response = sha256_hex(p.text.encode("utf-8"))
        finished.append((thread_id, p.call_id, _RECEIPT_STATUS[p.status.value], event.event_key, response, p.external_ref))


def _copy_state(view: StateView | None) -> StateView:
    return StateView(dict(view.facts), dict(view.versions)) if view is not None else StateView()


def _state_write(
    event: Event,
    state: StateView,
    catalog: tuple[int, ToolCatalog] | None,
    calls: Mapping[tuple[str, str], CallState],
    thread_id: str,
    seq: int,
) -> tuple[StateWrite, tuple[PatchOp, ...]] | None:
    """The state change an event makes: its own typed patch, or its tool's declared effects."""
    rules = catalog[1].paths if catalog else ()
    observed = event.client_ts.isoformat() if event.client_ts else None
    if isinstance(event, StatePatchEvent):
        p = event.payload
        write = plan_patch(state, p.ops, source=p.source, based_on=p.based_on_version, rules=rules,
                           event_key=event.event_key, seq=seq, observed_at=observed, evidence=p.evidence)
        return write, p.ops
    if isinstance(event, ToolOutcomeEvent) and catalog is not None:
        call = calls.get((thread_id, event.payload.call_id))
        spec = tool_spec(catalog[1], call.name) if call is not None else None
        if call is None or spec is None:
            return None
        ops = tuple(effects_of(spec, call.args, event.payload.status.value, event.payload.text))
        if not ops:
            return None
        try:
            write = plan_patch(state, ops, source="tool_effect", based_on={}, rules=rules,
                               event_key=event.event_key, seq=seq, observed_at=observed,
                               evidence=(f"call:{event.payload.call_id}", event.event_key))
        except InvalidEvent:
            # A catalog whose effect writes outside its own rules changes no state; the outcome
            # itself is still recorded — it happened.
            return None
        return write, ops
    return None


def _counts_as_turn(event: Event) -> int:
    """A user turn counts once per accepted new question (seed 000 §5.2)."""
    return int(isinstance(event, UserInputEvent) and is_new_question(event.payload.intent))


def _counts_as_step(event: Event) -> int:
    """A model step counts once per stored action response; completion checks never count."""
    return int(isinstance(event, AssistantMessageEvent) and is_model_step(event.payload.purpose))


def _check_policy(event: Event, tenant: str, reads: LedgerReads, chosen: Mapping[str, str]) -> str | None:
    """The policy a new session pins (its first event's, else the default); ``None`` if not new."""
    if event.session_id in reads.sessions or event.session_id in chosen:
        return None
    name = event.policy or DEFAULT_POLICY_NAME
    if (tenant, name) not in reads.policies and ("", name) not in reads.policies:
        raise UnknownPolicy(name)
    return name


def _check_tenant(tenant: str, session_id: str, tenants: Mapping[str, str]) -> None:
    """A session is its first event's tenant's: another tenant cannot write into it."""
    owner = tenants.get(session_id)
    if owner is not None and owner != tenant:
        raise ForeignSession(session_id)


def _open_cursor(thread_id: str, event: Event, head: ThreadHead | None) -> _ThreadCursor:
    if head is None:
        return _ThreadCursor(
            thread_id, event.session_id, event.run_id, event.instance_id, None, 0, GENESIS_HASH, None
        )
    return _ThreadCursor(
        thread_id,
        head.session_id,
        event.run_id,
        event.instance_id,
        head.revision,
        head.last_seq,
        head.last_hash,
        head.last_event_key,
    )


def _check_scope(cursor: _ThreadCursor, event: Event) -> None:
    if cursor.session_id != event.session_id:
        raise ScopeViolation(cursor.thread_id, event.session_id, cursor.session_id)


def _check_key(known: KnownKey | None, event_key: str, content_sha: str) -> bool:
    """True for an exact duplicate (skip it); raises for a key reused with other content."""
    if known is None:
        return False
    if known.content_sha256 != content_sha:
        raise EventKeyConflict(event_key, known.seq)
    return True


def _check_outcome(event: Event, thread_id: str, calls: Mapping[tuple[str, str], CallState]) -> None:
    if not isinstance(event, ToolOutcomeEvent):
        return
    state = calls.get((thread_id, event.payload.call_id))
    if state is None:
        raise OrphanToolOutcome(event.payload.call_id, thread_id)
    if state.outcome_seq is not None:
        raise DuplicateToolOutcome(event.payload.call_id, state.outcome_seq)


def _check_calls(event: Event, thread_id: str, calls: Mapping[tuple[str, str], CallState]) -> None:
    if not isinstance(event, AssistantMessageEvent):
        return
    seen: set[str] = set()
    for call in event.payload.tool_calls:
        if call.call_id in seen or (thread_id, call.call_id) in calls:
            raise DuplicateCallId(call.call_id)
        seen.add(call.call_id)


def _note_calls(
    event: Event,
    thread_id: str,
    seq: int,
    calls: dict[tuple[str, str], CallState],
    new_calls: list[NewCall],
    outcomes: list[NewOutcome],
) -> None:
    if isinstance(event, AssistantMessageEvent):
        for call in event.payload.tool_calls:
            calls[(thread_id, call.call_id)] = CallState(call.call_id, seq, None, call.name, call.args)
            new_calls.append(NewCall(thread_id, call.call_id, call.name, seq, call.args))
    elif isinstance(event, ToolOutcomeEvent):
        state = calls[(thread_id, event.payload.call_id)]
        calls[(thread_id, event.payload.call_id)] = CallState(state.call_id, state.call_seq, seq, state.name, state.args)
        outcomes.append(NewOutcome(thread_id, event.payload.call_id, seq, event.payload.status.value))


def _identity_and_content(event: Event) -> dict[str, JsonValue]:
    return {
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


def _text_of(event: Event) -> str:
    match event:
        case SystemEvent() | UserInputEvent() | AssistantMessageEvent() | ToolOutcomeEvent():
            return event.payload.text
        case ResourceActivatedEvent():
            return event.payload.text
        case ChildResultEvent():
            return ""
        case RunStatusEvent():
            return event.payload.reason
        case ContextExportEvent():
            return event.payload.note
        case ContextResetEvent():
            return event.payload.reason
        case StatePatchEvent():
            return ""
        case OperationReconcileEvent():
            return event.payload.evidence
        case _:
            assert_never(event)


def _calls_of(event: Event) -> list[RenderedCall]:
    if isinstance(event, AssistantMessageEvent):
        return [RenderedCall(c.call_id, c.name, arguments_json(c.args)) for c in event.payload.tool_calls]
    return []


def _build_record(
    item: Decoded,
    cursor: _ThreadCursor,
    seq: int,
    content_sha: str,
    limits: RecordingLimits,
    counters: Mapping[EncodingName, TokenCounter],
) -> tuple[NewRecord, list[Blob]]:
    event = item.event
    text = _text_of(event)
    payload = event.payload.model_dump(mode="json", exclude={"text"})
    raw_text = text.encode("utf-8")
    blobs: list[Blob] = []
    blob_sha: str | None = None
    view_text: str | None = None
    if isinstance(event, ToolOutcomeEvent) and text:
        text_sha = sha256_hex(raw_text)
        # A failed output keeps its telling line even when it sits in the part the cut leaves out.
        keep = telling_line(text) if event.payload.status is not ToolStatus.SUCCESS else None
        trimmed = trim_tool_text(
            text, counters["o200k_base"], max_tokens=limits.tool_result_max_tokens, blob_ref=blob_ref(text_sha), keep=keep
        )
        if trimmed is not None:
            view_text = trimmed[0]
            blob_sha = text_sha
    mask_text: str | None = None
    if isinstance(event, ToolOutcomeEvent) and len(text) > limits.mask_min_chars:
        # Old outputs can later be shown as this preview; the full text must then be readable back.
        blob_sha = blob_sha or sha256_hex(raw_text)
        mask_text = _mask_preview(text, blob_ref(blob_sha))
    if blob_sha is None and len(raw_text) >= limits.blob_min_bytes:
        blob_sha = sha256_hex(raw_text)
    if blob_sha is not None:
        blobs.append(Blob(blob_sha, raw_text))
    content = content_of(event.kind, payload, view_text if view_text is not None else text)
    tokens = count_record(counters, content, _calls_of(event))
    mask_tokens = None
    if mask_text is not None:
        mask_tokens = count_record(counters, content_of(event.kind, payload, mask_text), [])
    record = NewRecord(
        thread_id=cursor.thread_id,
        seq=seq,
        session_id=cursor.session_id,
        session_ordinal=0,
        run_id=event.run_id,
        instance_id=event.instance_id,
        event_key=event.event_key,
        kind=event.kind,
        payload_json=json.dumps(payload, ensure_ascii=False, separators=(",", ":")),
        text=None if blob_sha is not None else text,
        blob_sha256=blob_sha,
        view_text=view_text,
        tokens=tokens,
        mask_text=mask_text,
        mask_tokens=mask_tokens,
        content_sha256=content_sha,
        prev_hash=cursor.last_hash,
        record_hash=chain_hash(cursor.last_hash, cursor.thread_id, seq, content_sha),
        client_ts=event.client_ts,
        stream_seq=item.incoming.stream_seq,
    )
    return record, blobs


def _mask_preview(text: str, ref: str) -> str:
    lines = text.splitlines()
    head = "\n".join(lines[:3])[:300]
    return f"{head}\n[… output masked to save context: {len(text)} chars, {len(lines)} lines; read it back from {ref} …]"


def _with_session_ordinal(record: NewRecord, ordinal: int) -> NewRecord:
    return replace(record, session_ordinal=ordinal)


def encode_raw(raw: bytes, keep: int) -> tuple[str, bool]:
    """Base64 of the raw payload, cut to ``keep`` bytes; returns ``(b64, truncated)``."""
    return base64.b64encode(raw[:keep]).decode("ascii"), len(raw) > keep
