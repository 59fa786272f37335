"""Opening PostgreSQL connections, with a failure at start reported as StoreUnavailable (URL redacted)."""

from __future__ import annotations

from typing import Any

import asyncpg

from services.store._errors import translate_pg_errors

__all__ = ["connect", "create_pool"]


async def connect(url: str, **options: Any) -> asyncpg.Connection:
    """One connection, or StoreUnavailable naming the server (never its password) and the cause."""
    with translate_pg_errors(connecting_to=url):
        return await asyncpg.connect(url, timeout=10, **options)


async def create_pool(url: str, *, min_size: int, max_size: int, **options: Any) -> asyncpg.Pool:
    """A pool whose first connections are open, or StoreUnavailable as for ``connect``."""
    with translate_pg_errors(connecting_to=url):
        return await asyncpg.create_pool(
            url, min_size=min_size, max_size=max_size, timeout=10, reset=_keep_session, **options
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Return a connection to the pool without asyncpg's reset query (a round trip on every release).

    The store keeps no session state to clear — no LISTEN, cursors, session settings or session
    advisory locks (the migration lock is transaction-scoped) — and asyncpg still rolls back an
    open transaction before this runs.
    """
