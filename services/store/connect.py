"""Opening PostgreSQL connections, with a failure at start reported as StoreUnavailable (URL redacted)."""

from __future__ import annotations

from typing import Any

import asyncpg

from ..errors import StoreUnavailable
from ..settings import redact_url

__all__ = ["connect", "create_pool"]

# What a wrong host, port, socket permission, password or database name raises at connect time.
_AT_CONNECT = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


async def connect(url: str, **options: Any) -> asyncpg.Connection:
    """One connection, or StoreUnavailable naming the server (never its password) and the cause."""
    try:
        return await asyncpg.connect(url, timeout=10, **options)
    except _AT_CONNECT as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {redact_url(url)}: {type(exc).__name__}: {exc}") from None


async def create_pool(url: str, *, min_size: int, max_size: int, **options: Any) -> asyncpg.Pool:
    """A pool whose first connections are open, or StoreUnavailable as for ``connect``."""
    try:
        return await asyncpg.create_pool(url, min_size=min_size, max_size=max_size, timeout=10, **options)
    except _AT_CONNECT as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {redact_url(url)}: {type(exc).__name__}: {exc}") from None
