"""Read-only views of a session for operators: runs, threads, snapshot boundaries."""

from __future__ import annotations

import asyncpg

from contracts import InspectedRun, InspectedThread, SessionInspection

from .errors import ThreadNotFound
from .store._errors import translate_pg_errors

__all__ = ["inspect_session"]

_SESSION = "SELECT session_id, principal_id, policy_name, policy_revision, last_seq, reset_seq FROM ctx.sessions WHERE session_id = $1 AND tenant = $2"
_RUNS = "SELECT run_id, status, main_thread_id, snapshot_through FROM ctx.runs WHERE session_id = $1 ORDER BY snapshot_through, created_at"
_THREADS = """
SELECT h.thread_id, h.run_id, h.role, h.parent_thread_id, h.last_seq,
       COALESCE(v.view_revision, 0) AS view_revision,
       (SELECT count(*) FROM ctx.summaries s WHERE s.thread_id = h.thread_id) AS summaries
FROM ctx.thread_heads h LEFT JOIN ctx.thread_views v USING (thread_id)
WHERE h.session_id = $1 ORDER BY h.created_at, h.thread_id
"""


async def inspect_session(pool: asyncpg.Pool, tenant: str, session_id: str) -> SessionInspection:
    """Everything recorded about the structure of a session of ``tenant``."""
    async with pool.acquire() as conn:
        with translate_pg_errors():
            session = await conn.fetchrow(_SESSION, session_id, tenant)
            if session is None:
                raise ThreadNotFound(f"session {session_id}")
            runs = await conn.fetch(_RUNS, session_id)
            threads = await conn.fetch(_THREADS, session_id)
    by_run: dict[str, list[InspectedThread]] = {}
    for t in threads:
        by_run.setdefault(t["run_id"], []).append(
            InspectedThread(
                thread_id=t["thread_id"],
                role=t["role"],
                parent_thread_id=t["parent_thread_id"],
                records=t["last_seq"],
                view_revision=t["view_revision"],
                summaries=t["summaries"],
            )
        )
    return SessionInspection(
        session_id=session_id,
        principal_id=session["principal_id"],
        policy=f"{session['policy_name']}@{session['policy_revision']}",
        last_seq=session["last_seq"],
        reset_seq=session["reset_seq"],
        runs=tuple(
            InspectedRun(
                run_id=r["run_id"],
                status=r["status"],
                main_thread_id=r["main_thread_id"],
                snapshot_through=r["snapshot_through"],
                threads=tuple(by_run.get(r["run_id"], ())),
            )
            for r in runs
        ),
    )
