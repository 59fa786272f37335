"""Context hook sets per agent release: registered revisions, and the one a session pinned."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.hooks import HookSet

from services.store.ledger import Conn

__all__ = ["PinnedHooks", "insert_hooks", "select_session_hooks"]


@dataclass(frozen=True, slots=True)
class PinnedHooks:
    """The hook set a session pinned, and its revision (recorded with every summary a hook shaped)."""

    hooks: HookSet
    revision: int


_INSERT = """
INSERT INTO ctx.context_hooks (tenant, release, revision, body)
SELECT $1, $2, COALESCE(max(revision), 0) + 1, $3::jsonb FROM ctx.context_hooks
WHERE tenant = $1 AND release = $2
RETURNING revision
"""
# The revision current when the session was created (its first event): a later one reaches only
# sessions created after it, as a tool catalog does.
_SESSION_HOOKS = """
SELECT s.session_id, h.body::text AS body, h.revision
FROM ctx.sessions s
LEFT JOIN LATERAL (
  SELECT body, revision FROM ctx.context_hooks h
  WHERE h.tenant = s.tenant AND h.release = s.agent_release AND h.created_at <= s.created_at
  ORDER BY h.revision DESC LIMIT 1
) h ON true
WHERE s.session_id = $1 AND s.tenant = $2
"""


async def insert_hooks(conn: Conn, tenant: str, hooks: HookSet) -> int:
    return int(await conn.fetchval(_INSERT, tenant, hooks.release, hooks.model_dump_json()))


async def select_session_hooks(conn: Conn, tenant: str, session_id: str) -> tuple[bool, PinnedHooks | None]:
    row = await conn.fetchrow(_SESSION_HOOKS, session_id, tenant)
    if row is None:
        return False, None
    body = row["body"]
    if body is None:
        return True, None
    return True, PinnedHooks(HookSet.model_validate_json(body), int(row["revision"]))
