"""The one place where asyncpg's exceptions become fleet errors.

Every store method runs under :func:`translate_pg_errors`, so nothing above the store sees a driver
type: a caller sees ``DuplicateEvent``, ``RevisionConflict``, ``StoreUnavailable`` or
``StoreRejected`` — never an ``asyncpg`` exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from contracts.exceptions import DuplicateEvent, RevisionConflict, StoreRejected, StoreUnavailable
from services.settings import redact_url

__all__ = ["CONNECTION_ERRORS", "CONTENT_SQLSTATE_CLASSES", "race_conflict", "translate_pg_errors"]

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

# SQLSTATE classes that blame the values sent: data exception (22), integrity constraint violation
# (23), program limit exceeded (54). Every other class is about the server or the schema — connection
# (08), transaction state (25), rollback (40), undefined table or permission (42), resources (53),
# locks (55), operator intervention (57), system (58), internal (XX) — and would fail for any value.
CONTENT_SQLSTATE_CLASSES = frozenset({"22", "23", "54"})

# Unique constraints whose violation means another writer got there first (retry on fresh reads).
# A call id already stored: the planner rejects one it read, so the insert meets one only in a race.
_RACE_CONSTRAINTS = frozenset(
    {
        "records_pkey",
        "records_session_seq",
        "thread_heads_pkey",
        "runs_one_active",
        "runs_pkey",
        "tool_calls_pkey",
    }
)


def race_conflict(thread_id: str, constraint: str) -> RevisionConflict:
    """What another writer's row under a racing unique constraint means: retry on fresh reads."""
    conflict = RevisionConflict(thread_id, -1, None)
    conflict.details["constraint"] = constraint
    conflict.message = f"{conflict.message} (unique constraint {constraint})"
    conflict.args = (conflict.message,)
    return conflict


def _store_fault(exc: asyncpg.PostgresError) -> StoreUnavailable:
    """A failure of the store that no value caused (a missing table, a full disk, a permission): it
    would fail for any input alike, so the caller retries later instead of blaming the input."""
    fault = StoreUnavailable(f"{type(exc).__name__} (SQLSTATE {exc.sqlstate}): {exc}")
    fault.details.update(error=type(exc).__name__, sqlstate=str(exc.sqlstate))
    return fault


# What the mapping below catches besides unique violations: every driver and connection failure.
_DRIVER_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, asyncpg.PostgresError)


@contextmanager
def translate_pg_errors(thread_id: str = "?", *, connecting_to: str | None = None) -> Iterator[None]:
    """Map asyncpg errors: event-key unique → DuplicateEvent, a racing unique → RevisionConflict,
    lost connections → StoreUnavailable, refused values → StoreRejected, any other server error (a fault of
    the store itself) → StoreUnavailable naming it. With ``connecting_to`` (a URL), any failure to open a
    connection is StoreUnavailable naming the server, never its password."""
    try:
        yield
    except asyncpg.exceptions.UniqueViolationError as exc:
        constraint = getattr(exc, "constraint_name", None) or ""
        if constraint == "records_event_key":
            raise DuplicateEvent(str(getattr(exc, "detail", "") or "?")) from exc
        if constraint in _RACE_CONSTRAINTS:
            raise race_conflict(thread_id, constraint) from exc
        raise StoreRejected(type(exc).__name__, str(exc.sqlstate), str(exc)) from exc
    except _DRIVER_ERRORS as exc:
        if connecting_to is not None:
            # What a wrong host, port, socket permission, password or database name raises at connect time.
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL at {redact_url(connecting_to)}: {type(exc).__name__}: {exc}"
            ) from None
        if isinstance(exc, CONNECTION_ERRORS):
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        assert isinstance(exc, asyncpg.PostgresError)
        sqlstate = str(exc.sqlstate)
        if sqlstate[:2] in CONTENT_SQLSTATE_CLASSES:
            raise StoreRejected(type(exc).__name__, sqlstate, str(exc)) from exc
        raise _store_fault(exc) from exc
