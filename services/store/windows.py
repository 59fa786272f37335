"""The windows of a thread and the handoffs that opened them. Only SQL here."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from contracts.windows import WindowHandoff

from contracts.exceptions import RevisionConflict
from services.killpoints import kill_point
from services.store.ledger import Conn

__all__ = ["OpenWindow", "commit_window", "current_window", "open_window_of", "windows_closed_after"]

_CURRENT = """
SELECT w.window_no, w.opened_after, h.body::text AS body
FROM ctx.windows w JOIN ctx.window_handoffs h USING (handoff_id)
WHERE w.thread_id = $1 ORDER BY w.window_no DESC LIMIT 1
"""
_ENSURE_VIEW = "INSERT INTO ctx.thread_views (thread_id) VALUES ($1) ON CONFLICT (thread_id) DO NOTHING"
# A window change is a view rewrite: it moves the view revision, compared and set like a summary's.
_BUMP_VIEW = """
UPDATE ctx.thread_views SET view_revision = view_revision + 1, updated_at = now()
WHERE thread_id = $1 AND view_revision = $2
RETURNING view_revision
"""
_VIEW_REVISION = "SELECT view_revision FROM ctx.thread_views WHERE thread_id = $1"
_INSERT_HANDOFF = """
INSERT INTO ctx.window_handoffs (handoff_id, thread_id, previous_window, new_window, trigger, body, tokens)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)
"""
_INSERT_WINDOW = """
INSERT INTO ctx.windows (thread_id, window_no, opened_after, handoff_id) VALUES ($1, $2, $3, $4)
"""
_CLOSED_AFTER = "SELECT opened_after FROM ctx.windows WHERE thread_id = $1 ORDER BY window_no"


@dataclass(frozen=True, slots=True)
class OpenWindow:
    """A thread's current window from 2 on: where it opened and the handoff it opened with."""

    number: int
    opened_after: int
    handoff: WindowHandoff


def open_window_of(window_no: int, opened_after: int, body: str) -> OpenWindow:
    """The open window from its row's values (``_CURRENT``'s columns)."""
    return OpenWindow(window_no, opened_after, WindowHandoff.model_validate_json(body))


async def current_window(conn: Conn, thread_id: str) -> OpenWindow | None:
    """The thread's newest window, or None while it is in window 1."""
    row = await conn.fetchrow(_CURRENT, thread_id)
    return None if row is None else open_window_of(row["window_no"], row["opened_after"], row["body"])


async def windows_closed_after(conn: Conn, thread_id: str) -> list[int]:
    """The session seq each window closed after, oldest first (a record's window follows)."""
    return [r["opened_after"] for r in await conn.fetch(_CLOSED_AFTER, thread_id)]


async def commit_window(conn: Conn, expected_view_revision: int, handoff: WindowHandoff, tokens: int) -> int:
    """Close the window with its handoff and open the next one, if the view is still at
    ``expected_view_revision``; the new view revision (``RevisionConflict`` otherwise)."""
    async with conn.transaction():
        await conn.execute(_ENSURE_VIEW, handoff.thread_id)
        revision = await conn.fetchval(_BUMP_VIEW, handoff.thread_id, expected_view_revision)
        if revision is None:
            actual = await conn.fetchval(_VIEW_REVISION, handoff.thread_id)
            raise RevisionConflict(handoff.thread_id, expected_view_revision, actual)
        handoff_id = uuid.UUID(handoff.handoff_id)
        await conn.execute(
            _INSERT_HANDOFF,
            handoff_id,
            handoff.thread_id,
            handoff.previous_window,
            handoff.new_window,
            handoff.trigger.value,
            handoff.model_dump_json(),
            tokens,
        )
        # K9: the handoff is written, the window not yet switched — a crash here must leave neither.
        kill_point("rollover.before_commit")
        await conn.execute(
            _INSERT_WINDOW, handoff.thread_id, handoff.new_window, handoff.last_event_seq, handoff_id
        )
    kill_point("rollover.after_commit")
    return int(revision)
