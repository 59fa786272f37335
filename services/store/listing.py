"""What the operator console lists: sessions across tenants, a thread's compactions, tool calls and
served contexts.

Only SQL and the rows it returns; each function takes the connection first. The memory store returns
the same rows (``memory.MemoryStore``), checked by the store contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from contracts import SummaryHook
from services.core.served import ServedContext

from services.store.ledger import Conn, Row
from services.store.views import parse_summary_hooks

__all__ = [
    "compaction_of_row",
    "CompactionEntry",
    "ServedStep",
    "SessionListing",
    "ToolCallEntry",
    "select_compactions",
    "select_served",
    "select_served_texts",
    "select_sessions",
    "select_tool_calls",
]


@dataclass(frozen=True, slots=True)
class SessionListing:
    """One session as the console's first page shows it."""

    tenant: str
    session_id: str
    principal_id: str | None
    agent_release: str | None
    policy: str
    last_seq: int
    runs: int
    threads: int


@dataclass(frozen=True, slots=True)
class CompactionEntry:
    """One committed summary of a thread: what it covered and what it saved."""

    view_revision: int
    covered_from: int
    covered_to: int
    tokens_before: int
    tokens_after: int
    summarizer: str
    trigger_reasons: tuple[str, ...]
    target_reached: bool
    # The hooks that narrowed or patched it.
    hooks: tuple[SummaryHook, ...] = ()
    summary_id: str = ""
    # The summary's text as the model reads it in place of the records it covers.
    text: str = ""


@dataclass(frozen=True, slots=True)
class ServedStep:
    """One context the fleet answered a thread: its step, when, and its manifest."""

    step: int
    served_at: datetime
    served: ServedContext


@dataclass(frozen=True, slots=True)
class ToolCallEntry:
    """One tool call of a thread and, once recorded, its outcome."""

    call_id: str
    name: str
    call_seq: int
    outcome_seq: int | None
    status: str | None


# Each query's columns are in its row type's field order (rows are read positionally).
# Newest first: an operator opens the console to look at what just happened.
_SESSIONS = """
SELECT s.tenant, s.session_id, s.principal_id, s.agent_release,
       s.policy_name || '@' || s.policy_revision AS policy, s.last_seq,
       (SELECT count(*) FROM ctx.runs r WHERE r.session_id = s.session_id) AS runs,
       (SELECT count(*) FROM ctx.thread_heads h WHERE h.session_id = s.session_id) AS threads
FROM ctx.sessions s
WHERE $1::text IS NULL OR s.tenant = $1
ORDER BY s.created_at DESC, s.session_id DESC
LIMIT $2
"""
_COMPACTIONS = """
SELECT view_revision, covered_from, covered_to, tokens_before, tokens_after, summarizer, trigger_reasons,
       target_reached, hooks::text AS hooks, summary_id::text AS summary_id, text
FROM ctx.summaries WHERE thread_id = $1 ORDER BY view_revision
"""
_SERVED = """
SELECT step, served_at, manifest::text AS manifest FROM ctx.served_contexts WHERE thread_id = $1
ORDER BY step, format
"""
_SERVED_TEXTS = "SELECT digest, text FROM ctx.served_texts WHERE thread_id = $1 AND digest = ANY($2::text[])"
_TOOL_CALLS = """
SELECT call_id, name, call_seq, outcome_seq, status FROM ctx.tool_calls WHERE thread_id = $1
ORDER BY call_seq, call_id
"""


async def select_sessions(conn: Conn, tenant: str | None, limit: int) -> list[SessionListing]:
    """The newest ``limit`` sessions of ``tenant`` (of every tenant when ``None``)."""
    return [SessionListing(*r) for r in await conn.fetch(_SESSIONS, tenant, limit)]


async def select_compactions(conn: Conn, thread_id: str) -> list[CompactionEntry]:
    """Every summary committed for the thread, oldest view first."""
    return [compaction_of_row(r) for r in await conn.fetch(_COMPACTIONS, thread_id)]


def compaction_of_row(r: Row) -> CompactionEntry:
    """A compaction from a ``ctx.summaries`` row."""
    return CompactionEntry(
        view_revision=r["view_revision"],
        covered_from=r["covered_from"],
        covered_to=r["covered_to"],
        tokens_before=r["tokens_before"],
        tokens_after=r["tokens_after"],
        summarizer=r["summarizer"],
        trigger_reasons=tuple(r["trigger_reasons"]),
        target_reached=r["target_reached"],
        hooks=parse_summary_hooks(r["hooks"]),
        summary_id=str(r["summary_id"]),
        text=r["text"],
    )


async def select_served(conn: Conn, thread_id: str) -> list[ServedStep]:
    return [
        ServedStep(r["step"], r["served_at"], ServedContext.model_validate_json(r["manifest"]))
        for r in await conn.fetch(_SERVED, thread_id)
    ]


async def select_served_texts(conn: Conn, thread_id: str, digests: Sequence[str]) -> dict[str, str]:
    return {r["digest"]: r["text"] for r in await conn.fetch(_SERVED_TEXTS, thread_id, list(digests))}


async def select_tool_calls(conn: Conn, thread_id: str) -> list[ToolCallEntry]:
    """The thread's tool calls in call order, each with its outcome's seq and status once recorded."""
    return [ToolCallEntry(*r) for r in await conn.fetch(_TOOL_CALLS, thread_id)]
