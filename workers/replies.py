"""Request/reply plumbing shared by the request handlers: raw decode, admission, typed errors, replies.

Where an answer may go is :class:`ReplyRule`'s: a request names its reply subject freely, and the
fleet's ``allow_responses`` would let it publish there, so a reply aimed anywhere but the requester's
inbox (an events stream, the JetStream API, a notice) is never sent (``contracts/identities.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from faststream.nats import NatsMessage, NatsResponse
from nats.errors import Error as NatsError
from pydantic import BaseModel, ValidationError

from contracts import ErrorCode, ErrorReply, reply_json
from contracts.identities import INBOX, reply_prefixes
from contracts.wire_json import WireJsonError, validate_wire
from contracts.exceptions import (
    CtxError,
    FleetUnavailable,
    InvalidRequest,
    Overloaded,
    StoreRejected,
    StoreUnavailable,
)
from services.store._errors import CONNECTION_ERRORS

from .admission import Admission, Slot

__all__ = [
    "Inbound",
    "RareWarning",
    "ReplyRefusal",
    "ReplyRule",
    "admitted",
    "error_reply",
    "error_response",
    "inbound",
    "parse_body",
    "reply_with",
    "require_subject_thread",
]

log = logging.getLogger("ctxfleet.requests")
_M = TypeVar("_M", bound=BaseModel)
# An outage fails every request the same way: one warning line per interval, not one per request.
_OUTAGE_LOG_EVERY_S = 10.0


class RareWarning:
    """A warning logged at most once per interval, with how many were not logged."""

    def __init__(self, every_s: float, message: str) -> None:
        self._every_s = every_s
        self._message = message
        self._last = float("-inf")
        self._quiet = 0

    def warn(self, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self._every_s:
            self._quiet += 1
            return
        more = f" (and {self._quiet} more since the last warning)" if self._quiet else ""
        log.warning(self._message + "%s", *args, more)
        self._last, self._quiet = now, 0


_outages = RareWarning(_OUTAGE_LOG_EVERY_S, "requests answered store_unavailable: %s")
# A client sees a plain reason only (StoreRejected.to_reply): the driver's words are logged here, and
# a client repeating a refused value must not flood the log either.
_refusals = RareWarning(_OUTAGE_LOG_EVERY_S, "requests the store refused: %s")


class ReplyRefusal(StrEnum):
    """Why an answer may not go where its request asks: a closed set, a metric's label."""

    # Anything but an inbox: an events stream, the JetStream API, a notice subject, a job queue.
    NOT_AN_INBOX = "not_an_inbox"
    # An inbox of an identity that may not send this request (another tenant's runtimes).
    FOREIGN_INBOX = "foreign_inbox"


@dataclass(frozen=True, slots=True)
class ReplyRule:
    """Where a request's answer may go: always an inbox; on a bus of named users, a requester's own.

    ``named_users``: the bus authenticates users by name with the grants of ``contracts/identities.py``
    (user and password: the embedded default, Compose, the Helm chart), so ``_INBOX.<user>.`` is
    readable by ``user`` alone. Without names (no authentication, a token, nkeys, JWTs) the fleet
    cannot tell one inbox from another, and any ``_INBOX.`` subject is answered.
    """

    named_users: bool = False

    def refusal(self, subject: str, tenant: str | None, reply: str) -> ReplyRefusal | None:
        """Why the answer to a request on ``subject`` (of ``tenant``) may not go to ``reply``, or None."""
        if not reply.startswith(f"{INBOX}."):
            return ReplyRefusal.NOT_AN_INBOX
        if self.named_users and not reply.startswith(reply_prefixes(subject, tenant)):
            return ReplyRefusal.FOREIGN_INBOX
        return None


@dataclass(frozen=True, slots=True)
class Inbound:
    """A message as the server delivered it: the raw body, its subject and its headers."""

    body: bytes
    subject: str
    headers: Mapping[str, str]
    # Where the answer goes (request/reply); empty for a plain publish.
    reply: str = ""

    def tokens(self, n: int) -> list[str]:
        """The last ``n`` tokens of the subject (the subscription's wildcards guarantee the count).

        Read from the subject rather than declared as FastStream ``Path()`` parameters: resolving those
        costs a thread hop per parameter on every request (0.46 ms of a 1.5 ms round trip).
        """
        return self.subject.split(".")[-n:]


async def inbound(msg: NatsMessage) -> Inbound:
    """FastStream decoder that hands the handler the whole delivered message, body left raw.

    The hot handlers take this as their one argument instead of a ``NatsMessage`` context parameter:
    fast_depends resolves a context parameter through a worker-thread hop on every message
    (0.3 ms of a 1 ms request/reply, and interpreter-lock contention with the loop).
    """
    raw = msg.raw_message
    return Inbound(msg.body, str(raw.subject), msg.headers or {}, raw.reply or "")


def parse_body(model: type[_M], body: bytes) -> _M:
    """Validate a request body strictly, within the wire's JSON limits; an invalid one is an
    InvalidRequest naming the field or the limit (a repeated key, U+0000, a number out of range…)."""
    try:
        return validate_wire(model, body)
    except WireJsonError as exc:
        raise InvalidRequest(f"invalid {model.__name__}: {exc.message}", **exc.details) from None
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"invalid {model.__name__}: {loc}: {first['msg']}") from None


def require_subject_thread(run_id: str, instance_id: str, thread_id: str, what: str = "request") -> None:
    """Refuse a body naming another thread than its subject: permissions vouch for the subject only."""
    if f"{run_id}.{instance_id}" != thread_id:
        raise InvalidRequest(f"{what} for thread {run_id}.{instance_id} sent on the subject of {thread_id}")


def error_reply(exc: Exception) -> ErrorReply:
    """The wire error of any failure; an unexpected one is logged and reported as internal.

    A lost or refused database connection is ``store_unavailable`` wherever it was raised (a pool
    acquire raises a bare ``OSError``), logged as one rate-limited line, not a traceback each. Neither
    it nor a value the store refused tells the client the driver's words: those are logged.
    """
    if isinstance(exc, NatsError):  # its timeouts are TimeoutErrors too, but not the database's
        exc = FleetUnavailable(f"{type(exc).__name__}: {exc}")
    elif isinstance(exc, CONNECTION_ERRORS) and not isinstance(exc, CtxError):
        exc = StoreUnavailable(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, StoreUnavailable):
        _outages.warn(exc.message)
    elif isinstance(exc, StoreRejected):
        _refusals.warn(exc.message)
    if isinstance(exc, CtxError):
        return exc.to_reply()
    log.exception("request failed unexpectedly")
    return ErrorReply(code=ErrorCode.INTERNAL, message=f"{type(exc).__name__}: {exc}", retryable=True)


def error_response(exc: Exception) -> NatsResponse:
    return NatsResponse(reply_json(error_reply(exc)), headers={"ctx-status": "error"})


async def admitted(
    admission: Admission, headers: Mapping[str, str] | None, run: Callable[[Slot], Awaitable[NatsResponse]]
) -> NatsResponse:
    """Run a request in a compute slot; answer ``overloaded`` at once when there is none.

    ``DeadlinePassed`` propagates on purpose: FastStream then sends no reply to a caller that is gone.
    """
    try:
        async with admission.slot(headers) as slot:
            return await run(slot)
    except Overloaded as exc:
        return error_response(exc)


async def reply_with(run: Callable[[], Awaitable[BaseModel]]) -> NatsResponse:
    """Run a request and answer with its model, or with the typed error it raised."""
    try:
        result = await run()
    except Exception as exc:
        return error_response(exc)
    return NatsResponse(reply_json(result), headers={"ctx-status": "ok"})
