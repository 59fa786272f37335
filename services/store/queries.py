"""Sessions, receipts, read-back and tool catalogs: what requests read straight from the store.

Only SQL here; each function takes the connection first."""

from __future__ import annotations

from contracts import InspectedRun, InspectedThread, Receipt, SessionInspection, ToolCatalog

from services.store.ledger import Conn, EvidenceRow, evidence_of_row

__all__ = [
    "insert_catalog",
    "select_receipt",
    "select_session",
    "select_session_blob",
    "select_session_record",
]

# Columns named as the inspection's fields, so a row fills its model by name.
_SESSION = """
SELECT session_id, principal_id, policy_name || '@' || policy_revision AS policy, last_seq, reset_seq
FROM ctx.sessions WHERE session_id = $1 AND tenant = $2
"""
_RUNS = (
    "SELECT run_id, status, main_thread_id, snapshot_through FROM ctx.runs WHERE session_id = $1 "
    "ORDER BY snapshot_through, created_at"
)
_THREADS = """
SELECT h.thread_id, h.run_id, h.role, h.parent_thread_id, h.last_seq AS records,
       COALESCE(v.view_revision, 0) AS view_revision,
       (SELECT count(*) FROM ctx.summaries s WHERE s.thread_id = h.thread_id) AS summaries
FROM ctx.thread_heads h LEFT JOIN ctx.thread_views v USING (thread_id)
WHERE h.session_id = $1 ORDER BY h.created_at, h.thread_id
"""
_RECEIPT = """
SELECT r.operation_id, r.thread_id, r.call_id, r.tool, r.request_sha256, r.status, r.requested_event,
       r.finished_event, r.response_sha256, r.external_ref, r.reconciled_event
FROM ctx.receipts r JOIN ctx.sessions s ON s.session_id = r.session_id
WHERE r.session_id = $1 AND r.operation_id = $2 AND s.tenant = $4
  AND (s.principal_id IS NULL OR s.principal_id = $3)
"""
_SESSION_BLOB = """
SELECT b.content FROM ctx.blobs b
WHERE b.sha256 = $2
  AND EXISTS (SELECT 1 FROM ctx.records r WHERE r.blob_sha256 = $2 AND r.session_id = $1)
  AND EXISTS (SELECT 1 FROM ctx.sessions s WHERE s.session_id = $1 AND s.tenant = $4
              AND (s.principal_id IS NULL OR s.principal_id = $3))
"""
_SESSION_RECORD = """
SELECT r.event_key, r.kind, r.content_sha256, r.record_hash, r.text, r.blob_sha256, b.content AS blob
FROM ctx.records r
LEFT JOIN ctx.blobs b ON r.text IS NULL AND b.sha256 = r.blob_sha256
WHERE r.session_id = $1 AND r.thread_id = $2 AND r.seq = $3
  AND EXISTS (SELECT 1 FROM ctx.sessions s WHERE s.session_id = $1 AND s.tenant = $4
              AND (s.principal_id IS NULL OR s.principal_id = $5))
"""
_INSERT_CATALOG = """
INSERT INTO ctx.tool_catalogs (tenant, release, revision, body)
SELECT $1, $2, COALESCE(max(revision), 0) + 1, $3::jsonb FROM ctx.tool_catalogs
WHERE tenant = $1 AND release = $2
RETURNING revision
"""


async def select_session(conn: Conn, tenant: str, session_id: str) -> SessionInspection | None:
    """The structure of a session of ``tenant`` (runs, threads, snapshot boundaries), if it has one."""
    session = await conn.fetchrow(_SESSION, session_id, tenant)
    if session is None:
        return None
    run_rows = await conn.fetch(_RUNS, session_id)
    by_run: dict[str, list[InspectedThread]] = {}
    for row in await conn.fetch(_THREADS, session_id):
        thread = dict(row)
        by_run.setdefault(thread.pop("run_id"), []).append(InspectedThread(**thread))
    runs = tuple(InspectedRun(**dict(r), threads=tuple(by_run.get(r["run_id"], ()))) for r in run_rows)
    return SessionInspection(**dict(session), runs=runs)


async def select_receipt(
    conn: Conn, tenant: str, session_id: str, operation_id: str, principal_id: str | None
) -> Receipt | None:
    """The receipt of an operation of a session of ``tenant`` the principal may see."""
    row = await conn.fetchrow(_RECEIPT, session_id, operation_id, principal_id, tenant)
    return None if row is None else Receipt(**dict(row))


async def select_session_record(
    conn: Conn, tenant: str, session_id: str, thread_id: str, seq: int, principal_id: str | None
) -> EvidenceRow | None:
    """One record of the session (text inline, or its blob's bytes), if the principal may see the session."""
    r = await conn.fetchrow(_SESSION_RECORD, session_id, thread_id, seq, tenant, principal_id)
    return None if r is None else evidence_of_row(r)


async def select_session_blob(
    conn: Conn, tenant: str, session_id: str, sha256: str, principal_id: str | None
) -> bytes | None:
    """A blob a record of the session references, if the principal may see the session (unverified)."""
    content = await conn.fetchval(_SESSION_BLOB, session_id, sha256, principal_id, tenant)
    return None if content is None else bytes(content)


async def insert_catalog(conn: Conn, tenant: str, catalog: ToolCatalog) -> int:
    """Store ``catalog`` as the next revision of its release in ``tenant``; returns the revision."""
    return int(await conn.fetchval(_INSERT_CATALOG, tenant, catalog.release, catalog.model_dump_json()))
