"""The one place where asyncpg's exceptions become fleet errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from ..errors import DuplicateEvent, RevisionConflict, StoreUnavailable

__all__ = ["CONNECTION_ERRORS", "translate_pg_errors"]

# Every asyncpg failure that means "the database is not reachable right now"; retrying later helps.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.InterfaceError,
    # "cannot switch to state …; another operation is in progress": a connection the server dropped
    # mid-operation (seen on PostgreSQL restarts); the pool replaces it on the next acquire.
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
    ConnectionError,
    OSError,
    TimeoutError,
)


@contextmanager
def translate_pg_errors(thread_id: str = "?") -> Iterator[None]:
    """Map asyncpg errors: event-key unique → DuplicateEvent, seq unique → RevisionConflict,
    lost connections → StoreUnavailable. Anything else is a bug and propagates unchanged."""
    try:
        yield
    except asyncpg.exceptions.UniqueViolationError as exc:
        constraint = getattr(exc, "constraint_name", None) or ""
        if constraint == "records_event_key":
            raise DuplicateEvent(str(getattr(exc, "detail", "") or "?")) from exc
        if constraint in ("records_pkey", "records_session_seq", "thread_heads_pkey", "runs_one_active", "runs_pkey"):
            conflict = RevisionConflict(thread_id, -1, None)
            conflict.details["constraint"] = constraint
            conflict.message = f"{conflict.message} (unique constraint {constraint})"
            conflict.args = (conflict.message,)
            raise conflict from exc
        raise
    except CONNECTION_ERRORS as exc:
        raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
