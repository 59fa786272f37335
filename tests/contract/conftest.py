"""Every contract test runs once per store: the in-memory twin and PostgreSQL, through the same ports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from services.store.memory import MemoryStore
from services.store.postgres import PgStore


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.pg)])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """``None`` for the memory store; a fresh database (started outside the event loop) for PostgreSQL."""
    return None if request.param == "memory" else str(request.getfixturevalue("database_url"))


@pytest.fixture
async def store(store_url: str | None) -> AsyncIterator[Any]:
    if store_url is None:
        yield MemoryStore()
        return
    pool = await asyncpg.create_pool(store_url, min_size=1, max_size=2)
    try:
        yield PgStore(pool)
    finally:
        await pool.close()
