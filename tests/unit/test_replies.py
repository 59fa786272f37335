"""The one place failures become replies: outages are typed and retryable, never internal_error."""

from __future__ import annotations

import logging

import asyncpg
import pytest
from nats.errors import TimeoutError as NatsTimeout

from contracts import ErrorCode
from services.errors import RevisionConflict
from workers.replies import error_reply


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
