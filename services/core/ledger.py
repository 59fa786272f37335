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

from contracts import (
    AssistantMessagePayload,
    EventKind,
)

import base64
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import NamedTuple, assert_never

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
    PhaseChangeEvent,
    RunStatusEvent,
    StatePatchEvent,
    SystemEvent,
    ToolOutcomeEvent,
    ToolStatus,
    UserInputEvent,
    decode_event,
)
from contracts.events import content_identity
from contracts.ids import EVENT_KEY_PATTERN
from contracts.subjects import msg_id_of, parse_stored_subject

from contracts.exceptions import (
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
from services.core import json_text
from services.core.hashing import GENESIS_HASH, canonical_json, chain_hash, sha256_hex
from services.core.runs import Lifecycle, LifecycleChange, RunState, ThreadMeta
from services.core.state import StateView, StateWrite, record_write
from services.core.turns import counts_as_step, counts_as_turn
from services.core.render import (
    RenderedCall,
    TokenCounts,
    arguments_json,
    content_of,
    record_content,
    count_rendered,
    telling_line,
    trim_tool_text,
)
from services.core.records import RecordBody, parse_body
from services.core.tokens import EncodingName, TokenCounter, counter_for

__all__ = [
    "BatchKeys",
    "BatchPlan",
    "batch_keys",
    "Blob",
    "CallState",
    "Decoded",
    "Duplicate",
    "HeadWrite",
    "Incoming",
    "KnownKey",
    "LedgerReads",
    "NewCall",
    "NewOutcome",
    "NewRecord",
    "PlannedStateWrite",
    "ReceiptFinish",
    "ReceiptReconcile",
    "ReceiptRequest",
    "RecordingLimits",
    "Rejection",
    "SessionReset",
    "ThreadHead",
    "blob_ref",
    "content_sha256_of",
    "decode_batch",
    "deferred_tokens",
    "encode_raw",
    "plan_batch",
    "plan_steps",
    "readable_event_key",
    "run_steps",
    "texts_to_count",
    "writes_only_its_threads",
]


@dataclass(frozen=True, slots=True)
class Incoming:
    subject: str
    data: bytes
    stream_seq: int
    # The publisher's ``Nats-Msg-Id``; ``None`` when it sent none (then only Postgres dedups).
    msg_id: str | None = None


@dataclass(frozen=True, slots=True)
class RecordingLimits:
    """The recorder's configurable limits."""

    max_event_bytes: int = 8 * 1024 * 1024
    # Text this large is stored once in ctx.blobs, by its hash: smaller, a row of its own costs more
    # than the copies it saves.
    blob_min_bytes: int = 4096
    tool_result_max_tokens: int = 2000
    # A user input longer than this is shown as its head and tail, the whole readable back: a question
    # every prepare must show (the run's task, the current request) still fits the usual profiles.
    user_input_max_tokens: int = 32_000
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
    # The thread the event's body names when it was published on another thread's subject: a prepare
    # on either thread naming its key is told of the refusal.
    named_thread: str | None = None


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
class BatchKeys:
    """What a batch names, for the store to read into its ``LedgerReads``; each in first-seen order."""

    thread_ids: Sequence[str]
    keys: Sequence[tuple[str, str]]
    calls: Sequence[tuple[str, str]]
    session_ids: Sequence[str] = ()
    run_ids: Sequence[str] = ()
    # Parent threads the batch's first events name: read for their metadata only.
    extra_threads: Sequence[str] = ()
    release_names: Sequence[tuple[str, str]] = ()
    operation_ids: Sequence[tuple[str, str]] = ()
    tenants: Sequence[str] = ()


def batch_keys(decoded: Sequence[Decoded | Rejection]) -> BatchKeys:
    """The threads, keys, calls, sessions, runs, releases and operations the decoded events name."""
    sessions: dict[str, None] = {}
    tenants: dict[str, None] = {}
    releases: dict[tuple[str, str], None] = {}
    operations: dict[tuple[str, str], None] = {}
    runs: dict[str, None] = {}
    parents: dict[str, None] = {}
    threads: dict[str, None] = {}
    keys: dict[tuple[str, str], None] = {}
    calls: dict[tuple[str, str], None] = {}
    for item in decoded:
        if isinstance(item, Rejection):
            continue
        thread = item.subject_thread
        threads[thread] = None
        sessions[item.event.session_id] = None
        tenants[item.tenant] = None
        runs[item.event.run_id] = None
        if item.event.agent_release:
            releases[(item.tenant, item.event.agent_release)] = None
        if isinstance(item.event, OperationReconcileEvent):
            operations[(item.event.session_id, item.event.payload.operation_id)] = None
        if item.event.parent_instance_id is not None:
            parents[f"{item.event.run_id}.{item.event.parent_instance_id}"] = None
        keys[(thread, item.event.event_key)] = None
        if isinstance(item.event, ToolOutcomeEvent):
            calls[(thread, item.event.payload.call_id)] = None
        elif isinstance(item.event, AssistantMessageEvent):
            for call in item.event.payload.tool_calls:
                calls[(thread, call.call_id)] = None
                if call.operation_id is not None:
                    operations[(item.event.session_id, call.operation_id)] = None
    return BatchKeys(
        list(threads),
        list(keys),
        list(calls),
        list(sessions),
        list(runs),
        list(parents),
        list(releases),
        list(operations),
        list(tenants),
    )


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
    # The consumer's position in the partition, when the read asked for it (``tracking``): read with
    # the rest, so a batch costs one round trip fewer.
    tracked: int = 0


@dataclass(frozen=True, slots=True)
class Blob:
    """Large content, stored once under its sha256."""

    sha256: str
    content: bytes


@dataclass(frozen=True, slots=True)
class NewRecord:
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


class Duplicate(NamedTuple):
    """An exact redelivery of an event already recorded: nothing is written for it."""

    thread_id: str
    event_key: str


class SessionReset(NamedTuple):
    """A context reset: the session's views start over at the reset's record."""

    session_id: str
    thread_id: str
    seq: int


class PlannedStateWrite(NamedTuple):
    """A state change made by the record at (thread, seq), with the ops it came from."""

    thread_id: str
    seq: int
    event_key: str
    write: StateWrite
    ops: tuple[PatchOp, ...]


class ReceiptRequest(NamedTuple):
    """A side-effecting call's receipt, opened by the assistant message that asked for it."""

    session_id: str
    operation_id: str
    thread_id: str
    call_id: str
    tool: str
    request_sha256: str
    requested_event: str


class ReceiptFinish(NamedTuple):
    """A receipt closed by the call's outcome."""

    thread_id: str
    call_id: str
    status: str
    finished_event: str
    response_sha256: str
    external_ref: str | None


class ReceiptReconcile(NamedTuple):
    """A receipt settled by the orchestrator after the fact."""

    session_id: str
    operation_id: str
    status: str
    external_ref: str | None
    reconciled_event: str


@dataclass(frozen=True)
class BatchPlan:
    """Every write a batch makes, decided before any of them happens."""

    records: tuple[NewRecord, ...] = ()
    blobs: tuple[Blob, ...] = ()
    heads: tuple[HeadWrite, ...] = ()
    calls: tuple[NewCall, ...] = ()
    outcomes: tuple[NewOutcome, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    duplicates: tuple[Duplicate, ...] = ()
    session_counts: Mapping[str, int] = field(default_factory=dict)
    # The policy and tenant of each session the batch creates.
    session_policies: Mapping[str, str] = field(default_factory=dict)
    session_tenants: Mapping[str, str] = field(default_factory=dict)
    new_runs: tuple[RunState, ...] = ()
    run_statuses: Mapping[str, str] = field(default_factory=dict)
    new_threads: Mapping[str, ThreadMeta] = field(default_factory=dict)
    principals: Mapping[str, str] = field(default_factory=dict)
    releases: Mapping[str, str] = field(default_factory=dict)
    resets: tuple[SessionReset, ...] = ()
    state_writes: tuple[PlannedStateWrite, ...] = ()
    session_catalogs: Mapping[str, int] = field(default_factory=dict)
    receipts_requested: tuple[ReceiptRequest, ...] = ()
    receipts_finished: tuple[ReceiptFinish, ...] = ()
    receipts_reconciled: tuple[ReceiptReconcile, ...] = ()


def writes_only_its_threads(plan: BatchPlan) -> bool:
    """True when ``plan`` writes nothing but its threads' records, heads, calls and outcomes (the
    receipts those outcomes settle, and the blobs of their long texts, stored under their hash): no
    session, run, thread role, state, catalog or dead letter — nothing another thread's plan reads."""
    return not (
        plan.principals
        or plan.releases
        or plan.new_threads
        or plan.new_runs
        or plan.run_statuses
        or plan.resets
        or plan.rejections
        or plan.session_catalogs
        or plan.receipts_requested
        or plan.receipts_reconciled
        or plan.state_writes
    )


def blob_ref(sha256: str) -> str:
    """The reference by which stored content can be read back."""
    return f"ctx://blob/{sha256}"


# An event key as the envelope writes it (keys cannot hold quotes or backslashes: EVENT_KEY_PATTERN).
_KEY_IN_BYTES = re.compile(rb'"event_key"\s*:\s*"([A-Za-z0-9_:/.@=+-]{1,200})"')
# The envelope comes first: the key is looked for in this much of a payload, not in all of it.
_KEY_SCAN_BYTES = 65_536
_EVENT_KEY = re.compile(EVENT_KEY_PATTERN)


def readable_event_key(incoming: Incoming, thread_id: str | None) -> str | None:
    """The event key a payload that failed to decode still names, so a prepare waiting on that key is
    told at once that it was rejected (``event_rejected``) instead of waiting out its ``wait_ms``.

    From the bytes where they spell it (malformed JSON after the key, a missing field, an unknown
    kind, an oversize or badly encoded payload), else from the ``Nats-Msg-Id`` the publisher derived
    from it (``<thread>/<key>/<digest>``); ``None`` when neither names one.
    """
    found = _KEY_IN_BYTES.search(incoming.data[:_KEY_SCAN_BYTES])
    if found is not None:
        return found.group(1).decode("ascii")
    msg_id = incoming.msg_id
    if msg_id and thread_id and msg_id.startswith(f"{thread_id}/"):
        key = msg_id[len(thread_id) + 1 :].rpartition("/")[0]
        if key and _EVENT_KEY.fullmatch(key):
            return key
    return None


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
            key = readable_event_key(incoming, subject_thread)
            out.append(Rejection(incoming, subject_thread, key, exc.code, exc.message, exc.details))
            continue
        try:
            _check_subject(subject_thread, event)
            _check_subject_session(subject_session, event)
            _check_msg_id(incoming, event)
        except InvalidEvent as exc:
            out.append(_reject(incoming, subject_thread or event.thread_id, event, exc))
            continue
        assert stored is not None
        out.append(Decoded(incoming, stored.thread_id, event, stored.tenant))
    return out


def _reject(incoming: Incoming, thread_id: str, event: Event, exc: InvalidEvent) -> Rejection:
    # Filed under the subject's thread, and for a mismatch under the body's too: the runtime that
    # published may wait on either thread's key, and must hear event_rejected rather than wait out its
    # wait_ms.
    named = event.thread_id if event.thread_id != thread_id else None
    return Rejection(incoming, thread_id, event.event_key, exc.code, exc.message, exc.details, named)


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
    plan = run_steps(plan_steps(decoded, reads, limits, counters), until=lambda: False)
    assert plan is not None
    return plan


def run_steps(steps: Generator[None, None, BatchPlan], *, until: Callable[[], bool]) -> BatchPlan | None:
    """Advance :func:`plan_steps` to its plan, or ``None`` as soon as ``until()`` holds after a step."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            plan: BatchPlan = done.value
            return plan
        if until():
            return None


def plan_steps(
    decoded: Sequence[Decoded | Rejection],
    reads: LedgerReads,
    limits: RecordingLimits,
    counters: Mapping[EncodingName, TokenCounter],
) -> Generator[None, None, BatchPlan]:
    """:func:`plan_batch`, pausing after each event: the plan of a large batch takes tens of
    milliseconds, and its caller may let other work run between events (the recorder shares its
    event loop with prepares). Returns the plan as the generator's value."""
    chains = _Chains(reads.heads, dict(reads.keys))
    calls = _Calls(dict(reads.calls))
    sessions = _Sessions(reads)
    state = _States(reads)
    receipts = _Receipts(set(reads.operations))
    rejections: list[Rejection] = []
    for item in decoded:
        yield
        if isinstance(item, Rejection):
            rejections.append(item)
            continue
        event, thread_id = item.event, item.subject_thread
        cursor = chains.cursor(thread_id, event)
        content_sha = content_sha256_of(event)
        # The checks run in this order so an event breaking several rules is always rejected for the same one.
        try:
            sessions.check_tenant(item)
            if chains.check(cursor, event, content_sha):
                chains.duplicates.append(Duplicate(thread_id, event.event_key))
                continue
            calls.check(event, thread_id)
            admitted = sessions.check(item)
            state.pin_catalog(item, admitted.known)
            receipts.check(event)
            write = state.check(event, thread_id, cursor.seq + 1, calls.known)
        except InvalidEvent as exc:
            rejections.append(_reject(item.incoming, thread_id, event, exc))
            continue
        seq = chains.apply(item, cursor, content_sha, limits, counters)
        sessions.apply(item, admitted, seq)
        state.apply(event, write, pins_release=admitted.change.release is not None)
        receipts.apply(event, thread_id)
        calls.apply(event, thread_id, seq)
    new_runs, new_threads, principals, releases = sessions.life.written()
    return BatchPlan(
        records=tuple(chains.records),
        blobs=tuple(chains.blobs.values()),
        heads=chains.heads(),
        calls=tuple(calls.new_calls),
        outcomes=tuple(calls.outcomes),
        rejections=tuple(rejections),
        duplicates=tuple(chains.duplicates),
        session_counts=chains.session_counts,
        session_policies=sessions.policies,
        session_tenants={s: sessions.tenants[s] for s in sessions.policies},
        new_runs=new_runs,
        run_statuses=sessions.life.run_statuses,
        new_threads=new_threads,
        principals=principals,
        releases=releases,
        resets=tuple(sessions.resets),
        state_writes=tuple(state.writes),
        session_catalogs=state.session_catalogs,
        receipts_requested=tuple(receipts.requested),
        receipts_finished=tuple(receipts.finished),
        receipts_reconciled=tuple(receipts.reconciled),
    )


# Each sub-plan below owns one part of the batch's writes: ``check`` raises InvalidEvent (and changes
# nothing a later event could see) unless the event may be recorded; ``apply`` records an accepted event.


@dataclass
class _Chains:
    """Records, blobs and thread heads: consecutive seqs, chained hashes, one record per key (4 and 7)."""

    heads_read: Mapping[str, ThreadHead]
    keys: dict[tuple[str, str], KnownKey]
    cursors: dict[str, _ThreadCursor] = field(default_factory=dict)
    records: list[NewRecord] = field(default_factory=list)
    blobs: dict[str, Blob] = field(default_factory=dict)
    duplicates: list[Duplicate] = field(default_factory=list)
    session_counts: dict[str, int] = field(default_factory=dict)

    def cursor(self, thread_id: str, event: Event) -> _ThreadCursor:
        """The thread's cursor so far; a new one is kept only once its thread records an event."""
        return self.cursors.get(thread_id) or _open_cursor(thread_id, event, self.heads_read.get(thread_id))

    def check(self, cursor: _ThreadCursor, event: Event, content_sha: str) -> bool:
        """True for an exact redelivery, which records nothing."""
        _check_scope(cursor, event)
        return _check_key(self.keys.get((cursor.thread_id, event.event_key)), event.event_key, content_sha)

    def apply(
        self,
        item: Decoded,
        cursor: _ThreadCursor,
        content_sha: str,
        limits: RecordingLimits,
        counters: Mapping[EncodingName, TokenCounter],
    ) -> int:
        """Append the event's record to its thread; its seq."""
        event = item.event
        self.cursors[cursor.thread_id] = cursor
        cursor.user_turns += counts_as_turn(event.payload)
        cursor.model_steps += counts_as_step(event.payload)
        seq = cursor.seq + 1
        ordinal = self.session_counts[cursor.session_id] = self.session_counts.get(cursor.session_id, 0) + 1
        record, blob_list = _build_record(item, cursor, seq, ordinal, content_sha, limits, counters)
        self.records.append(record)
        for blob in blob_list:
            self.blobs.setdefault(blob.sha256, blob)
        self.keys[(cursor.thread_id, event.event_key)] = KnownKey(seq, content_sha)
        cursor.seq, cursor.last_hash, cursor.last_event_key = seq, record.record_hash, event.event_key
        cursor.dirty = True
        return seq

    def heads(self) -> tuple[HeadWrite, ...]:
        return tuple(
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
            for c in self.cursors.values()
            if c.dirty
        )


@dataclass
class _Calls:
    """Tool calls opened and closed: an outcome answers an open call of its thread, a call id is used once
    (5, 6)."""

    known: dict[tuple[str, str], CallState]
    new_calls: list[NewCall] = field(default_factory=list)
    outcomes: list[NewOutcome] = field(default_factory=list)

    def check(self, event: Event, thread_id: str) -> None:
        _check_outcome(event, thread_id, self.known)
        _check_calls(event, thread_id, self.known)

    def apply(self, event: Event, thread_id: str, seq: int) -> None:
        if isinstance(event, AssistantMessageEvent):
            for call in event.payload.tool_calls:
                self.known[(thread_id, call.call_id)] = CallState(
                    call.call_id, seq, None, call.name, call.args
                )
                self.new_calls.append(NewCall(thread_id, call.call_id, call.name, seq, call.args))
        elif isinstance(event, ToolOutcomeEvent):
            key = (thread_id, event.payload.call_id)
            self.known[key] = replace(self.known[key], outcome_seq=seq)
            self.outcomes.append(
                NewOutcome(thread_id, event.payload.call_id, seq, event.payload.status.value)
            )


@dataclass(frozen=True, slots=True)
class _Admitted:
    """What the session checks decided for an event: the policy a new session pins,
    and its lifecycle change."""

    policy: str | None
    known: bool
    change: LifecycleChange


class _Sessions:
    """Sessions, runs and threads: tenant, policy, principal, release and lifecycle (invariant 3)."""

    def __init__(self, reads: LedgerReads) -> None:
        self._reads = reads
        self.tenants: dict[str, str] = dict(reads.sessions)
        self.policies: dict[str, str] = {}
        self.life = Lifecycle(reads.runs, reads.active_runs, reads.threads, reads.principals, reads.releases)
        self.resets: list[SessionReset] = []

    def check_tenant(self, item: Decoded) -> None:
        _check_tenant(item.tenant, item.event.session_id, self.tenants)

    def check(self, item: Decoded) -> _Admitted:
        event = item.event
        policy = _check_policy(event, item.tenant, self._reads, self.policies)
        known = event.session_id in self._reads.sessions or event.session_id in self.policies
        return _Admitted(policy, known, self.life.check(event, item.subject_thread, session_known=known))

    def apply(self, item: Decoded, admitted: _Admitted, seq: int) -> None:
        if admitted.policy is not None:
            self.policies[item.event.session_id] = admitted.policy
            self.tenants[item.event.session_id] = item.tenant
        self.life.apply(admitted.change, item.subject_thread, seq)
        if admitted.change.reset_session is not None:
            self.resets.append(SessionReset(admitted.change.reset_session, item.subject_thread, seq))


class _States:
    """Typed state: each thread's facts as the batch changes them, and the tool catalog each session pins."""

    def __init__(self, reads: LedgerReads) -> None:
        self._reads = reads
        self.views: dict[str, StateView] = {}
        self.catalogs: dict[str, tuple[int, ToolCatalog]] = dict(reads.catalogs)
        self.session_catalogs: dict[str, int] = {}
        self.writes: list[PlannedStateWrite] = []

    def pin_catalog(self, item: Decoded, session_known: bool) -> None:
        """A new session naming a release takes that release's newest catalog."""
        event = item.event
        release = (item.tenant, event.agent_release or "")
        if not session_known and event.agent_release and release in self._reads.latest_catalogs:
            self.catalogs.setdefault(event.session_id, self._reads.latest_catalogs[release])

    def check(
        self, event: Event, thread_id: str, seq: int, calls: Mapping[tuple[str, str], CallState]
    ) -> PlannedStateWrite | None:
        view = self.views.setdefault(thread_id, _copy_state(self._reads.states.get(thread_id)))
        catalog = self.catalogs.get(event.session_id)
        call = calls.get((thread_id, event.payload.call_id)) if isinstance(event, ToolOutcomeEvent) else None
        write = record_write(
            event.payload,
            view,
            catalog[1] if catalog else None,
            (call.name, call.args) if call else None,
            event_key=event.event_key,
            seq=seq,
            observed_at=event.client_ts.isoformat() if event.client_ts else None,
        )
        return (
            None if write is None else PlannedStateWrite(thread_id, seq, event.event_key, write[0], write[1])
        )

    def apply(self, event: Event, write: PlannedStateWrite | None, *, pins_release: bool) -> None:
        if (
            pins_release
            and event.session_id in self.catalogs
            and event.session_id not in self._reads.catalogs
        ):
            self.session_catalogs[event.session_id] = self.catalogs[event.session_id][0]
        if write is not None:
            self.views[write.thread_id].apply(write.write)
            self.writes.append(write)


@dataclass
class _Receipts:
    """Operation receipts: an operation id is executed once per session and settled only if it exists."""

    operations: set[tuple[str, str]]
    requested: list[ReceiptRequest] = field(default_factory=list)
    finished: list[ReceiptFinish] = field(default_factory=list)
    reconciled: list[ReceiptReconcile] = field(default_factory=list)

    def check(self, event: Event) -> None:
        _check_operations(event, self.operations)
        _check_reconcile(event, self.operations)

    def apply(self, event: Event, thread_id: str) -> None:
        if isinstance(event, AssistantMessageEvent):
            for call in event.payload.tool_calls:
                if call.operation_id is None:
                    continue
                digest = sha256_hex(canonical_json({"tool": call.name, "args": call.args}))
                self.operations.add((event.session_id, call.operation_id))
                self.requested.append(
                    ReceiptRequest(
                        event.session_id,
                        call.operation_id,
                        thread_id,
                        call.call_id,
                        call.name,
                        digest,
                        event.event_key,
                    )
                )
        elif isinstance(event, ToolOutcomeEvent):
            out = event.payload
            response = sha256_hex(out.text.encode("utf-8"))
            self.finished.append(
                ReceiptFinish(
                    thread_id,
                    out.call_id,
                    _RECEIPT_STATUS[out.status.value],
                    event.event_key,
                    response,
                    out.external_ref,
                )
            )
        elif isinstance(event, OperationReconcileEvent):
            settle = event.payload
            self.reconciled.append(
                ReceiptReconcile(
                    event.session_id, settle.operation_id, settle.status, settle.external_ref, event.event_key
                )
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
    if (
        isinstance(event, OperationReconcileEvent)
        and (event.session_id, event.payload.operation_id) not in operations
    ):
        raise UnknownOperation(event.payload.operation_id)


_RECEIPT_STATUS = {"success": "success", "error": "failed", "timeout": "timeout", "unknown": "unknown"}


def _copy_state(view: StateView | None) -> StateView:
    return StateView(dict(view.facts), dict(view.versions)) if view is not None else StateView()


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


def content_sha256_of(event: Event) -> str:
    """The content hash the ledger records for ``event`` (``content_sha256``): the SHA-256 of the
    canonical JSON of its identity and content. Two bodies under one key are the same event exactly when
    their hashes are equal (invariant 4), so a prepare naming its event by this hash learns at once of
    a key reused for other content."""
    # The bytes ``contracts.content_sha256`` hashes, written faster (a test holds the two equal).
    return sha256_hex(canonical_json(content_identity(event)))


def _text_of(event: Event) -> str:
    match event:
        case (
            SystemEvent()
            | UserInputEvent()
            | AssistantMessageEvent()
            | ToolOutcomeEvent()
            | ResourceActivatedEvent()
        ):
            return event.payload.text
        case RunStatusEvent() | ContextResetEvent():
            return event.payload.reason
        case ContextExportEvent() | PhaseChangeEvent():
            return event.payload.note
        case OperationReconcileEvent():
            return event.payload.evidence
        case ChildResultEvent() | StatePatchEvent():
            return ""
        case _:
            assert_never(event)


def texts_to_count(decoded: Sequence[Decoded | Rejection]) -> list[str]:
    """The texts the plan of ``decoded`` will count, as far as they are known before it runs: each
    event's text (a tool output's whole text, which decides its cut, and the content of most kinds),
    the content of a failed output or a resource (the text under a heading), and its calls' names,
    arguments and ids. Only what the plan makes itself is left to it: a cut output's new text and a
    long output's preview. Counted ahead
    (``CountAhead``), they spare the plan its tokenizer time."""
    texts: list[str] = []
    for item in decoded:
        if not isinstance(item, Decoded):
            continue
        event = item.event
        text = _text_of(event)
        texts.append(text)
        if (
            isinstance(event, ToolOutcomeEvent) and event.payload.status is not ToolStatus.SUCCESS
        ) or isinstance(event, ResourceActivatedEvent):
            texts.append(record_content(event.payload, text))
        for call in _rendered_calls(event.payload):
            texts += (call.name, call.arguments, call.call_id)
    return texts


def _rendered_calls(body: RecordBody) -> list[RenderedCall]:
    if isinstance(body, AssistantMessagePayload):
        return [RenderedCall(c.call_id, c.name, arguments_json(c.args)) for c in body.tool_calls]
    return []


def _build_record(
    item: Decoded,
    cursor: _ThreadCursor,
    seq: int,
    session_ordinal: int,
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
    cut: tuple[int, str] | None = None  # the most tokens shown, and what is cut
    keep: str | None = None
    if isinstance(event, ToolOutcomeEvent) and text:
        cut = limits.tool_result_max_tokens, "output"
        # A failed output keeps its telling line even when it sits in the part the cut leaves out.
        keep = telling_line(text) if event.payload.status is not ToolStatus.SUCCESS else None
    # A token is at least one byte: a text of fewer bytes than the limit is never counted to find out.
    elif isinstance(event, UserInputEvent) and len(raw_text) > limits.user_input_max_tokens:
        cut = limits.user_input_max_tokens, "input"
    if cut is not None:
        text_sha = sha256_hex(raw_text)
        ref = blob_ref(text_sha)
        trimmed = trim_tool_text(
            text, counters["o200k_base"], max_tokens=cut[0], blob_ref=ref, keep=keep, what=cut[1]
        )
        if trimmed is not None:
            view_text, blob_sha = trimmed[0], text_sha
    mask_text: str | None = None
    if isinstance(event, ToolOutcomeEvent) and len(text) > limits.mask_min_chars:
        # Old outputs can later be shown as this preview; the full text must then be readable back.
        blob_sha = blob_sha or sha256_hex(raw_text)
        mask_text = _mask_preview(text, blob_ref(blob_sha))
    if blob_sha is None and len(raw_text) >= limits.blob_min_bytes:
        blob_sha = sha256_hex(raw_text)
    if blob_sha is not None:
        blobs.append(Blob(blob_sha, raw_text))
    content = record_content(event.payload, view_text if view_text is not None else text)
    calls = _rendered_calls(event.payload)
    tokens = _counted(counters, content, calls)
    mask_tokens = None
    if mask_text is not None:
        mask_tokens = _counted(counters, record_content(event.payload, mask_text), [])
    record = NewRecord(
        thread_id=cursor.thread_id,
        seq=seq,
        session_id=cursor.session_id,
        session_ordinal=session_ordinal,
        run_id=event.run_id,
        instance_id=event.instance_id,
        event_key=event.event_key,
        kind=event.kind,
        payload_json=json_text.compact(payload),
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


def _counted(
    counters: Mapping[EncodingName, TokenCounter], content: str, calls: Sequence[RenderedCall]
) -> TokenCounts:
    """o200k now; cl100k deferred to the first profile that asks (it is a third of the recorder's
    tokenizer time, for profiles most sessions never use)."""
    return TokenCounts(
        o200k_base=count_rendered(counters["o200k_base"], content, calls),
        cl100k_base=lambda: count_rendered(_cl100k(counters), content, calls),
    )


def _cl100k(counters: Mapping[EncodingName, TokenCounter]) -> TokenCounter:
    # Looked up only when a count is made, so a recorder never loads the cl100k tables for nothing.
    return counters["cl100k_base"] if "cl100k_base" in counters else counter_for("cl100k_base")


def deferred_tokens(
    kind: str, payload: Mapping[str, JsonValue], text: str, o200k_base: int, cl100k_base: int | None
) -> TokenCounts:
    """A stored record's tokens; a cl100k count the recorder deferred (``None``) is made on first use.

    Counted exactly as the recorder would have: the same rendered content and calls (from the
    stored payload, which is what the recorder rendered them from).
    """
    if cl100k_base is not None:
        return TokenCounts(o200k_base=o200k_base, cl100k_base=cl100k_base)

    def count() -> int:
        calls = _rendered_calls(parse_body(EventKind(kind), payload))
        return count_rendered(counter_for("cl100k_base"), content_of(kind, payload, text), calls)

    return TokenCounts(o200k_base=o200k_base, cl100k_base=count)


def _mask_preview(text: str, ref: str) -> str:
    lines = text.splitlines()
    head = "\n".join(lines[:3])[:300]
    return (
        f"{head}\n[… output masked to save context: {len(text)} chars, {len(lines)} lines; "
        f"read it back from {ref} …]"
    )


def encode_raw(raw: bytes, keep: int) -> tuple[str, bool]:
    """Base64 of the raw payload, cut to ``keep`` bytes; returns ``(b64, truncated)``."""
    return base64.b64encode(raw[:keep]).decode("ascii"), len(raw) > keep
