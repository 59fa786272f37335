"""The store's one error mapping covers every driver failure the fleet depends on.

Each asyncpg exception is built as the driver builds it from a server message (so its class follows
from its SQLSTATE) and sent through ``translate_pg_errors``: none may leave as a driver type, a bare
``CtxError`` or an ``internal`` error, and each lands on the fleet error its handling relies on.
"""

from __future__ import annotations

import asyncpg
import pytest

from contracts import ErrorCode
from contracts.exceptions import CtxError, DuplicateEvent, RevisionConflict, StoreUnavailable
from services.store._errors import StoreRejected, translate_pg_errors


def _server(sqlstate: str, message: str = "refused", constraint: str | None = None) -> asyncpg.PostgresError:
    fields = {"C": sqlstate, "M": message, "D": "Key (thread_id, event_key)=(r.main, k1) already exists."}
    if constraint is not None:
        fields["n"] = constraint
    return asyncpg.PostgresError.new(fields)


def _translated(exc: BaseException, **kw: str) -> CtxError:
    with pytest.raises(CtxError) as caught:
        with translate_pg_errors("r.main", **kw):
            raise exc
    error = caught.value
    assert type(error) is not CtxError and error.code is not ErrorCode.INTERNAL, (
        f"{type(exc).__name__} maps to a bare error"
    )
    if not kw:
        assert error.__cause__ is exc, "the driver's error stays the cause, for the logs"
    return error


# Lost or refused connections, and the rollbacks a retry on fresh state resolves: retried,
# never blamed on input.
UNAVAILABLE: list[BaseException] = [
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.exceptions.ConnectionFailureError("connection failure"),
    asyncpg.exceptions.InterfaceError("pool is closing"),
    asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
    OSError(2, "No such file or directory: '/run/postgresql/.s.PGSQL.5432'"),
    TimeoutError(),
    _server("57P01", "terminating connection due to administrator command"),  # AdminShutdownError
    _server("57P02", "terminating connection due to crash of another server process"),  # CrashShutdownError
    _server("57P03", "the database system is starting up"),  # CannotConnectNowError
    _server("53300", "sorry, too many clients already"),  # TooManyConnectionsError
    _server("08006", "connection failure"),  # ConnectionFailureError (from the server)
    _server("40001", "could not serialize access due to concurrent update"),  # SerializationError
    _server("40P01", "deadlock detected"),  # DeadlockDetectedError
    # Faults of the store itself: any input would fail alike, so they are retried too.
    _server("42P01", 'relation "ctx.records" does not exist'),  # UndefinedTableError
    _server("42501", "permission denied for table records"),  # InsufficientPrivilegeError
    _server("53100", "could not extend file: No space left on device"),  # DiskFullError
    _server("55P03", "could not obtain lock on row"),  # LockNotAvailableError
    _server("57014", "canceling statement due to statement timeout"),  # QueryCanceledError
    _server("XX000", "internal error"),  # InternalServerError
]

# Values the server refuses: the same values fail the same way, so a recorder dead-letters the event.
REJECTED: list[asyncpg.PostgresError] = [
    _server("22000", "invalid input for query argument $9"),  # DataError
    _server("22021", 'invalid byte sequence for encoding "UTF8": 0x00'),  # CharacterNotInRepertoireError
    _server("22P02", "invalid input syntax for type json"),  # InvalidTextRepresentationError
    _server("22003", "value out of range"),  # NumericValueOutOfRangeError
    _server("22P05", "unsupported Unicode escape sequence"),  # UntranslatableCharacterError
    _server("23514", "new row violates check constraint", "records_text_xor_blob"),  # CheckViolationError
    _server("23502", 'null value in column "policy_revision"'),  # NotNullViolationError
    _server(
        "23503", "violates foreign key constraint", "thread_views_thread_id_fkey"
    ),  # ForeignKeyViolationError
    _server("23505", "duplicate key value", "receipts_pkey"),  # UniqueViolationError, not a race
    _server("54000", "index row size exceeds maximum"),  # ProgramLimitExceededError
]

RACES = ["records_pkey", "records_session_seq", "thread_heads_pkey", "runs_one_active", "runs_pkey"]


@pytest.mark.parametrize("exc", UNAVAILABLE, ids=lambda e: type(e).__name__)
def test_a_lost_connection_or_a_store_fault_is_store_unavailable(exc: BaseException) -> None:
    error = _translated(exc)
    assert isinstance(error, StoreUnavailable) and error.retryable
    assert type(exc).__name__ in error.message


def test_each_server_failure_above_is_the_driver_class_the_fleet_names() -> None:
    # The SQLSTATEs above must keep building the classes the fleet's handling is written against.
    names = {type(e).__name__ for e in UNAVAILABLE + REJECTED}
    assert {
        "AdminShutdownError",
        "CrashShutdownError",
        "CannotConnectNowError",
        "TooManyConnectionsError",
        "SerializationError",
        "DeadlockDetectedError",
        "UndefinedTableError",
        "DiskFullError",
        "DataError",
        "CharacterNotInRepertoireError",
        "CheckViolationError",
        "NotNullViolationError",
        "ForeignKeyViolationError",
        "UniqueViolationError",
        "ProgramLimitExceededError",
    } <= names


@pytest.mark.parametrize("exc", REJECTED, ids=lambda e: f"{type(e).__name__}-{e.sqlstate}")
def test_a_refused_value_is_store_rejected_naming_the_driver_error_and_sqlstate(
    exc: asyncpg.PostgresError,
) -> None:
    error = _translated(exc)
    assert isinstance(error, StoreRejected) and not error.retryable
    assert (error.details["error"], error.details["sqlstate"]) == (type(exc).__name__, exc.sqlstate)
    assert error.code is ErrorCode.INVALID_REQUEST


def test_a_recorded_event_key_is_a_duplicate_event() -> None:
    error = _translated(_server("23505", "duplicate key value", "records_event_key"))
    assert isinstance(error, DuplicateEvent) and "k1" in error.message


@pytest.mark.parametrize("constraint", RACES)
def test_a_racing_unique_violation_is_a_revision_conflict_naming_the_constraint(constraint: str) -> None:
    error = _translated(_server("23505", "duplicate key value", constraint))
    assert isinstance(error, RevisionConflict) and error.retryable
    assert error.details == {"thread_id": "r.main", "expected": -1, "actual": None, "constraint": constraint}


def _postgres_error_classes() -> list[type[asyncpg.PostgresError]]:
    out: list[type[asyncpg.PostgresError]] = []
    todo: list[type[asyncpg.PostgresError]] = [asyncpg.PostgresError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in out if getattr(c, "sqlstate", None)]


@pytest.mark.parametrize("cls", _postgres_error_classes(), ids=lambda c: f"{c.__name__}-{c.sqlstate}")
def test_every_server_error_class_asyncpg_defines_maps_to_a_typed_fleet_error(
    cls: type[asyncpg.PostgresError],
) -> None:
    error = _translated(_server(str(cls.sqlstate)))
    assert isinstance(error, (StoreUnavailable, StoreRejected, DuplicateEvent, RevisionConflict))


def test_a_failure_to_connect_is_store_unavailable_naming_the_server_but_not_its_password() -> None:
    url = "postgresql://ctx:s3cret@db.internal:5432/ctx"
    for exc in (
        OSError(111, "Connection refused"),
        _server("28P01", "password authentication failed"),
        TimeoutError(),
    ):
        error = _translated(exc, connecting_to=url)
        assert isinstance(error, StoreUnavailable)
        assert "db.internal" in error.message and "s3cret" not in error.message
        assert error.__cause__ is None  # the driver's message may carry the URL


def test_anything_but_a_driver_error_passes_unchanged() -> None:
    with pytest.raises(ValueError):
        with translate_pg_errors():
            raise ValueError("a bug, not the store")
