"""Search within what the asking principal's session recorded; hits are pointers, not evidence."""

from __future__ import annotations

from contracts import SearchReply, SearchRequest

from contracts.exceptions import ThreadNotFound
from services.store.ports import QueryStore

__all__ = ["search"]


async def search(store: QueryStore, request: SearchRequest, *, tenant: str) -> SearchReply:
    """The best hits of the query in the request's session of ``tenant`` (nothing from any other session)."""
    hits = await store.search(tenant, request)
    if hits is None:
        raise ThreadNotFound(f"session {request.session_id}")
    return SearchReply(hits=hits)
