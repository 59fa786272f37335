"""Session forks and history reads for export. Only SQL here; each function takes
the connection first."""

from __future__ import annotations

import json
from dataclasses import dataclass

from services.store.ledger import Conn, Row

__all__ = [
    "ForkOrigin",
    "ForkParent",
    "HistoryRow",
    "history_of_row",
    "NewFork",
    "insert_fork",
    "last_reset",
    "select_fork",
    "select_fork_parent",
    "select_history",
]


@dataclass(frozen=True, slots=True)
class ForkOrigin:
    """Where a forked session branched: its parent, the seq, and the reset fence it inherited."""

    parent_session_id: str
    at_seq: int
    inherited_reset: int


@dataclass(frozen=True, slots=True)
class ForkParent:
    """What forking reads of the session to branch from."""

    session_id: str
    last_seq: int
    principal_id: str | None


@dataclass(frozen=True, slots=True)
class NewFork:
    """A fork to create: its id, the session it copies its pins from, and its branch point."""

    session_id: str
    parent_session_id: str
    at_seq: int
    inherited_reset: int


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One main-thread record with its full text, as an export or a fork check reads it."""

    seq: int
    thread_id: str
    run_id: str
    kind: str
    payload: dict[str, object]
    text: str
    client_ts: str | None


_SELECT_FORK = (
    "SELECT parent_session_id, at_seq, inherited_reset FROM ctx.session_forks WHERE session_id = $1"
)
_SELECT_PARENT = (
    "SELECT session_id, last_seq, principal_id FROM ctx.sessions WHERE session_id = $1 AND tenant = $2"
)
# One statement: the fork's session row (its pins copied from the parent, its seq starting at the
# branch point) and its fork row, or nothing when the id is taken.
_INSERT_FORK = """
WITH s AS (
    INSERT INTO ctx.sessions (session_id, last_seq, policy_name, policy_revision, tenant, principal_id,
                              agent_release, catalog_revision, reset_seq)
    SELECT $1, $3, policy_name, policy_revision, tenant, principal_id, agent_release, catalog_revision, $4
    FROM ctx.sessions WHERE session_id = $2
    ON CONFLICT (session_id) DO NOTHING
    RETURNING session_id
)
INSERT INTO ctx.session_forks (session_id, parent_session_id, at_seq, inherited_reset)
SELECT session_id, $2, $3, $4 FROM s
RETURNING session_id
"""
_LAST_RESET = """
SELECT COALESCE(max(session_seq), 0) FROM ctx.records
WHERE session_id = $1 AND kind = 'context_reset' AND session_seq <= $2
"""
_SELECT_HISTORY = """
SELECT r.session_seq, r.thread_id, r.run_id, r.kind, r.payload,
       COALESCE(r.text, convert_from(b.content, 'UTF8')) AS text, r.client_ts
FROM ctx.records r
JOIN ctx.thread_heads h ON h.thread_id = r.thread_id AND h.role = 'main'
LEFT JOIN ctx.blobs b ON r.text IS NULL AND b.sha256 = r.blob_sha256
WHERE r.session_id = $1 AND r.session_seq > $2 AND r.session_seq <= $3
ORDER BY r.session_seq
LIMIT $4
"""


async def select_fork(conn: Conn, session_id: str) -> ForkOrigin | None:
    """The fork origin of ``session_id``, if it is a fork."""
    r = await conn.fetchrow(_SELECT_FORK, session_id)
    return None if r is None else ForkOrigin(*r)


async def select_fork_parent(conn: Conn, tenant: str, session_id: str) -> ForkParent | None:
    """The session of ``tenant`` named ``session_id``; ``None`` if missing or another tenant's."""
    r = await conn.fetchrow(_SELECT_PARENT, session_id, tenant)
    return None if r is None else ForkParent(*r)


async def insert_fork(conn: Conn, fork: NewFork) -> bool:
    created = await conn.fetchval(
        _INSERT_FORK, fork.session_id, fork.parent_session_id, fork.at_seq, fork.inherited_reset
    )
    return created is not None


async def last_reset(conn: Conn, session_id: str, through: int) -> int:
    """The seq of the session's newest own context reset at or before ``through`` (0 if none)."""
    return int(await conn.fetchval(_LAST_RESET, session_id, through))


async def select_history(
    conn: Conn, session_id: str, *, after: int, through: int, limit: int
) -> list[HistoryRow]:
    """The session's own main-thread records with ``after < seq <= through``, in order, full text."""
    return [history_of_row(r) for r in await conn.fetch(_SELECT_HISTORY, session_id, after, through, limit)]


def history_of_row(r: Row) -> HistoryRow:
    """A main-thread record from a row with its full text (inline, or its blob's)."""
    return HistoryRow(
        r["session_seq"],
        r["thread_id"],
        r["run_id"],
        r["kind"],
        json.loads(r["payload"]),
        r["text"] or "",
        r["client_ts"].isoformat() if r["client_ts"] else None,
    )
