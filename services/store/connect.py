"""Opening PostgreSQL connections, with a failure at start reported as StoreUnavailable (URL redacted)."""

from __future__ import annotations

from typing import Any

import asyncpg

from services.store._errors import translate_pg_errors

__all__ = ["connect", "create_pool", "plan_once"]


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

    The store keeps no session state to clear — no LISTEN, cursors or session advisory locks (the
    migration lock is transaction-scoped); the one setting, a pool ``init``'s ``plan_once``, is meant
    to last — and asyncpg still rolls back an open transaction before this runs.
    """


async def plan_once(conn: asyncpg.Connection) -> None:
    """Make a connection run its prepared statements on generic plans (a pool's ``init``).

    PostgreSQL plans a prepared statement again on every execution while a plan for its arguments
    looks cheaper than the generic one, as it does for the recorder's batch read (a dozen sub-selects
    over arrays): measured 1.2–1.3 ms a read, 0.6–0.8 ms on generic plans, and 3.3 → 2.5 ms for a
    one-event batch (issue 16). Only for connections whose statements look rows up by key: a search's
    optional filters need a plan made for the arguments at hand. A ``SET`` rather than a startup
    parameter, which a connection pooler in front of the server may refuse.
    """
    await conn.execute("SET plan_cache_mode = force_generic_plan")
