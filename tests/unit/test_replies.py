"""The one place failures become replies: outages are typed and retryable, never internal_error."""

from __future__ import annotations

import logging

import asyncpg
import pytest
from nats.errors import TimeoutError as NatsTimeout

from contracts import ErrorCode, SearchRequest, reply_json
from contracts.exceptions import (
    EventRejected,
    InvalidRequest,
    RevisionConflict,
    StoreRejected,
    StoreUnavailable,
)
from workers import replies
from workers.replies import error_reply, parse_body


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        asyncpg.exceptions.ConnectionDoesNotExistError("gone"),
        OSError("no route"),
    ],
)
def test_error_reply_of_a_lost_database_connection_is_store_unavailable_without_a_traceback(
    exc: Exception, caplog: pytest.LogCaptureFixture, quiet_logs: None
) -> None:
    with caplog.at_level(logging.WARNING, logger="ctxfleet.requests"):
        reply = error_reply(exc)
    assert (reply.code, reply.retryable) == (ErrorCode.STORE_UNAVAILABLE, True)
    # The cause is the operator's to read, not the client's.
    assert type(exc).__name__ not in reply.message and reply.details == {}
    assert type(exc).__name__ in caplog.text
    assert all(r.exc_info is None for r in caplog.records)


@pytest.fixture
def quiet_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh rate-limited logs, so each test sees its own first warning."""
    monkeypatch.setattr(
        replies, "_outages", replies.RareWarning(10.0, "requests answered store_unavailable: %s")
    )
    monkeypatch.setattr(replies, "_refusals", replies.RareWarning(10.0, "requests the store refused: %s"))


@pytest.mark.parametrize(
    ("exc", "says"),
    [
        (
            StoreRejected(
                "CharacterNotInRepertoireError", "22021", 'invalid byte sequence for encoding "UTF8": 0x00'
            ),
            "form",
        ),
        (StoreRejected("NumericValueOutOfRangeError", "22003", "integer out of range"), "out of range"),
        (
            StoreRejected(
                "CheckViolationError", "23514", 'violates check constraint "calibrations_factor_check"'
            ),
            "conflicts",
        ),
        (StoreRejected("ProgramLimitExceededError", "54000", "string is too long for tsvector"), "too large"),
    ],
)
def test_error_reply_of_a_refused_value_is_invalid_request_in_plain_words_and_logs_the_driver_error(
    exc: StoreRejected, says: str, caplog: pytest.LogCaptureFixture, quiet_logs: None
) -> None:
    with caplog.at_level(logging.WARNING, logger="ctxfleet.requests"):
        reply = error_reply(exc)
    assert (reply.code, reply.retryable) == (ErrorCode.INVALID_REQUEST, False)
    assert says in reply.message and reply.details == {"refused": reply.message.split(": ", 1)[1]}
    wire = reply_json(reply).decode()
    assert not any(
        internal in wire for internal in ("SQLSTATE", exc.sqlstate, exc.details["error"], exc.cause)
    )
    assert exc.sqlstate in caplog.text and exc.cause in caplog.text


def test_error_reply_of_a_store_fault_tells_the_client_to_retry_and_nothing_of_the_store(
    caplog: pytest.LogCaptureFixture, quiet_logs: None
) -> None:
    # What _store_fault raises for a missing table: a server error no value caused.
    fault = StoreUnavailable('UndefinedTableError (SQLSTATE 42P01): relation "ctx.records" does not exist')
    fault.details.update(error="UndefinedTableError", sqlstate="42P01")
    with caplog.at_level(logging.WARNING, logger="ctxfleet.requests"):
        reply = error_reply(fault)
    assert (reply.code, reply.retryable, reply.details) == (ErrorCode.STORE_UNAVAILABLE, True, {})
    assert "42P01" not in reply_json(reply).decode() and "ctx.records" not in reply.message
    assert "42P01" in caplog.text


def test_error_reply_of_an_event_the_store_could_not_hold_names_its_code_and_nothing_of_the_store() -> None:
    # An unstorable_event dead letter's reason quotes the driver; the runtime learns the code alone.
    driver = "the write failed: ProgramLimitExceededError (SQLSTATE 54000): index row size exceeds maximum"
    reply = error_reply(EventRejected("k1", "unstorable_event", driver))
    wire = reply_json(reply).decode()
    assert (reply.code, reply.retryable) == (ErrorCode.EVENT_REJECTED, False)
    assert reply.details["rejected_code"] == "unstorable_event"
    assert not any(internal in wire for internal in ("SQLSTATE", "54000", "ProgramLimitExceeded"))


def test_error_reply_of_a_nats_timeout_is_fleet_unavailable_not_store_unavailable() -> None:
    reply = error_reply(NatsTimeout())
    assert (reply.code, reply.retryable) == (ErrorCode.FLEET_UNAVAILABLE, True)


def test_error_reply_keeps_a_typed_error_and_reports_a_bug_as_internal() -> None:
    assert error_reply(RevisionConflict("r.main", 1, 2)).code is ErrorCode.REVISION_CONFLICT
    assert error_reply(ValueError("bug")).code is ErrorCode.INTERNAL


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        (b'{"session_id":"s1","session_id":"s2","query":"x"}', "unique_keys"),
        (b'{"session_id":"s1","query":"x\\u0000"}', "no_nul"),
        (b'{"session_id":"s1","query":"x","limit":99999999999999999999}', "JSON_INT_MAX"),
    ],
    ids=["repeated-key", "nul", "int-beyond-64-bit"],
)
def test_parse_body_refuses_a_request_beyond_the_wire_limits_as_invalid_request_naming_the_limit(
    body: bytes, limit: str
) -> None:
    with pytest.raises(InvalidRequest, match="invalid SearchRequest") as err:
        parse_body(SearchRequest, body)
    assert err.value.details["limit"] == limit


def test_parse_body_is_strict_as_the_schema_types_are() -> None:
    with pytest.raises(InvalidRequest, match="limit"):
        parse_body(SearchRequest, b'{"session_id":"s1","query":"x","limit":"5"}')
    assert parse_body(SearchRequest, b'{"session_id":"s1","query":"x","limit":5}').limit == 5
