"""Inspect: an operator's read-only look at one thread's ledger."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ._base import SchemaVersion, WireModel
from .subjects import check_tenant, check_token
from .ids import split_thread_id
from .prepare import ModelProfile, PreparedContext, SummaryHook

__all__ = [
    "CONTEXT_SHOW",
    "SESSION_INSPECT",
    "ContextRequest",
    "ContextShown",
    "InspectRequest",
    "InspectedDeadLetter",
    "InspectedRecord",
    "InspectedRun",
    "InspectedThread",
    "SessionInspection",
    "ThreadInspection",
    "context_show_subject",
    "session_inspect_subject",
]

SESSION_INSPECT = "ctx.session.inspect"


def session_inspect_subject(tenant: str, session_id: str) -> str:
    """Where an operator asks for the runs, threads and snapshots of a session of ``tenant``."""
    return f"{SESSION_INSPECT}.{check_tenant(tenant)}.{check_token(session_id, 'session id')}"


CONTEXT_SHOW = "ctx.context"


def context_show_subject(tenant: str, thread_id: str) -> str:
    """Where an operator asks what the runtime's next prepare of ``thread_id`` would answer."""
    split_thread_id(thread_id)
    return f"{CONTEXT_SHOW}.{check_tenant(tenant)}.{thread_id}"


class ContextRequest(WireModel):
    """Ask what a thread's next prepare would answer, without preparing it: the session's policy
    budget unless a ``model_profile``, a ``profile`` or a ``budget_tokens`` cap is named."""

    schema_version: SchemaVersion = 1
    model_profile: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    profile: ModelProfile | None = None
    budget_tokens: Annotated[int, Field(gt=0)] | None = None


class ContextShown(WireModel):
    """The context a thread's next prepare would answer, the budget it was counted at and where that
    budget came from, and what that prepare would do first that showing it did not (compact, roll
    the window over): nothing was written to show it."""

    schema_version: SchemaVersion = 1
    type: Literal["context_shown"] = "context_shown"
    prepared: PreparedContext
    # The session's pinned policy, ``name@revision``.
    policy: str
    # Where the budget came from, in words: the session's policy, or what the request named.
    budget_source: str
    # What the runtime's prepare would do that this one only says: ask for a compaction and wait, roll over.
    runtime_would: tuple[str, ...] = ()
    # The thread's whole history, counted as ``ctxfleet compact`` counts a view: every record as a
    # context shows it with nothing left out and no summary in its place (a repeated tool output
    # counted once, as the reference every context shows in its place; past a rollover, the window's
    # handoff and what followed it), its state, and the tool schemas its prepares reserve room for.
    # What this context's request and hooks brought beside it (evidence, hook material) is not the
    # thread's: a context that left nothing out and shows no summary uses this plus those blocks' tokens.
    history_tokens: Annotated[int, Field(ge=0)] = 0


class InspectRequest(WireModel):
    """Ask for a thread's head and its last ``limit`` records."""

    schema_version: SchemaVersion = 1
    limit: Annotated[int, Field(ge=1, le=10_000)] = 50


class InspectedRecord(WireModel):
    """One ledger record as an operator sees it."""

    seq: int
    session_seq: int
    kind: str
    event_key: str
    tokens: int
    content_sha256: str
    record_hash: str
    blob_sha256: str | None = None
    preview: str
    # The tools the record names: an assistant message's calls in order, or the tool an outcome answers.
    tools: tuple[str, ...] = ()
    # A tool outcome's status (success, error, …); None for every other kind.
    status: str | None = None
    # The window the record belongs to: derived from where windows opened, never stored.
    window: int = 1


class InspectedDeadLetter(WireModel):
    """An event the recorder refused for this thread, and why."""

    stream_seq: int
    event_key: str | None = None
    code: str
    reason: str


class ThreadInspection(WireModel):
    """A thread's head, a verification of its whole hash chain, and its most recent records."""

    schema_version: SchemaVersion = 1
    type: Literal["thread_inspection"] = "thread_inspection"
    thread_id: str
    session_id: str
    revision: int
    record_count: int
    total_tokens: int
    last_event_key: str | None = None
    chain_verified: bool
    chain_error: str | None = None
    pending_call_ids: tuple[str, ...]
    dead_letters: int
    # The newest refusals (at most 10), newest first: what a person debugging the thread reads first.
    recent_dead_letters: tuple[InspectedDeadLetter, ...] = ()
    records: tuple[InspectedRecord, ...]
    view_revision: int = 0
    summaries: int = 0
    # The hooks that narrowed or patched the summary the view shows now.
    summary_hooks: tuple[SummaryHook, ...] = ()
    compaction_attempts: int = 0
    compaction_failures: int = 0
    last_compaction_failure: str | None = None
    deferred_reason: str | None = None
    state_facts: int = 0
    state_hash: str | None = None
    state_verified: bool = True
    # The thread's current window (1 until it first rolls over).
    window: int = 1


class InspectedThread(WireModel):
    """One thread of a run."""

    thread_id: str
    role: str
    parent_thread_id: str | None = None
    records: int
    view_revision: int
    summaries: int


class InspectedRun(WireModel):
    """One run (question) of a session, with the snapshot it inherited."""

    run_id: str
    status: str
    main_thread_id: str
    snapshot_through: int
    threads: tuple[InspectedThread, ...]


class SessionInspection(WireModel):
    """A session's runs in order, their threads and snapshot boundaries."""

    schema_version: SchemaVersion = 1
    type: Literal["session_inspection"] = "session_inspection"
    session_id: str
    principal_id: str | None = None
    policy: str
    last_seq: int
    reset_seq: int
    runs: tuple[InspectedRun, ...]
