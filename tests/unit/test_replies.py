"""The one place failures become replies: outages are typed and retryable, never internal_error."""

from __future__ import annotations

import logging

import asyncpg
import pytest
from nats.errors import TimeoutError as NatsTimeout

from contracts import ErrorCode, SearchRequest
from services.errors import InvalidRequest, RevisionConflict
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
    exc: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ctxfleet.requests"):
        reply = error_reply(exc)
    assert (reply.code, reply.retryable) == (ErrorCode.STORE_UNAVAILABLE, True)
    assert type(exc).__name__ in reply.message
    assert all(r.exc_info is None for r in caplog.records)


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
