"""Opening PostgreSQL connections, with a failure at start reported as StoreUnavailable (URL redacted)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from services.store._errors import translate_pg_errors

__all__ = ["connect", "create_pool"]


async def connect(url: str, **options: Any) -> asyncpg.Connection:
    """One connection, or StoreUnavailable naming the server (never its password) and the cause."""
    with translate_pg_errors(connecting_to=url):
        return await asyncpg.connect(url, timeout=10, **options)


# Types asyncpg learns from the server once per connection, on the first statement that uses one: the
# store's arrays of int8, int4 and timestamptz and its anonymous records (a view load's records). Each
# was a catalog query of 3-12 ms (PostgreSQL's log) inside whichever request first ran such a statement
# on a new connection, up to four of them; asked for together here, as the connection opens.
_PRIME_TYPES = "SELECT NULL::int8[], NULL::int4[], NULL::timestamptz[], ARRAY[ROW(1)]"


async def create_pool(
    url: str,
    *,
    min_size: int,
    max_size: int,
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    **options: Any,
) -> asyncpg.Pool:
    """A pool whose first connections are open, or StoreUnavailable as for ``connect``.

    Every connection learns the store's types when it opens, then runs ``init``; and a connection
    opened stays open however long it idles (asyncpg closed one after five idle minutes, so the first
    requests after an agent's long pause paid for opening it again, on their own time).
    """

    async def opened(conn: asyncpg.Connection) -> None:
        await conn.fetch(_PRIME_TYPES)
        if init is not None:
            await init(conn)

    with translate_pg_errors(connecting_to=url):
        return await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=10,
            init=opened,
            reset=_keep_session,
            max_inactive_connection_lifetime=0,
            **options,
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Return a connection to the pool without asyncpg's reset query (a round trip on every release).

    The store keeps no session state to clear — no LISTEN, cursors, session settings or session
    advisory locks (the migration lock is transaction-scoped) — and asyncpg still rolls back an
    open transaction before this runs.
    """
