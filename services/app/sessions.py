"""Read-only views of a session for operators: runs, threads, snapshot boundaries."""

from __future__ import annotations

from contracts import SessionInspection

from contracts.exceptions import ThreadNotFound
from services.store.ports import QueryStore

__all__ = ["inspect_session"]


async def inspect_session(store: QueryStore, tenant: str, session_id: str) -> SessionInspection:
    """Everything recorded about the structure of a session of ``tenant``."""
    found = await store.session_inspection(tenant, session_id)
    if found is None:
        raise ThreadNotFound(f"session {session_id}")
    return found
