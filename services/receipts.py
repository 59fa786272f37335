"""Operation receipts: what a recovering runtime asks before it re-executes a side effect."""

from __future__ import annotations

import asyncpg

from contracts import OperationStatusRequest, Receipt

from .errors import ContentNotFound
from .store._errors import translate_pg_errors

__all__ = ["operation_status"]

_SELECT = """
SELECT r.operation_id, r.thread_id, r.call_id, r.tool, r.request_sha256, r.status, r.requested_event,
       r.finished_event, r.response_sha256, r.external_ref, r.reconciled_event
FROM ctx.receipts r JOIN ctx.sessions s ON s.session_id = r.session_id
WHERE r.session_id = $1 AND r.operation_id = $2 AND s.tenant = $4 AND (s.principal_id IS NULL OR s.principal_id = $3)
"""


async def operation_status(pool: asyncpg.Pool, request: OperationStatusRequest, *, tenant: str) -> Receipt:
    """The receipt of an operation of the asking session of ``tenant``; requested-but-unfinished stays ``requested``."""
    async with pool.acquire() as conn:
        with translate_pg_errors():
            row = await conn.fetchrow(_SELECT, request.session_id, request.operation_id, request.principal_id, tenant)
    if row is None:
        raise ContentNotFound(f"operation {request.operation_id}")
    return Receipt(**dict(row))
