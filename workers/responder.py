"""Request/reply subscribers whose requests are answered from tasks of their own.

A FastStream subscriber with ``max_workers`` hands each message through an anyio memory stream,
semaphore and task group: measured here, a 19 KB request/reply took 1.08–1.13 ms that way, 0.68–0.70
with FastStream consuming in order, and 0.44 with nats-py alone (``benchmarks`` probe, embedded
NATS). So each request runs in a plain asyncio task that publishes its reply itself, and a
serving responder takes requests from nats-py subscriptions of its own (``start``): FastStream's
parser, middlewares and dependency injection were still 0.2–0.4 ms of every prepare (docs/design.md,
"Request/reply without FastStream's worker pool").
Endpoints are declared in one place all the same: a responder without a connection (the AsyncAPI
document's) declares each one as a FastStream subscriber, with the same subject, queue and title.

Invariants:

1. At most ``max_tasks`` requests of one endpoint are in hand at once; the next one waits in the
   consume loop (then in the client library's buffer), as it did behind ``max_workers``. What bounds
   computing is admission's slots (``workers/admission.py``), not this.
2. A request is answered at most once: with its handler's response; with the typed error of what
   the handler raised; or not at all when the caller's deadline passed (``DeadlinePassed``) or the
   request named no reply subject.
3. ``answered()`` returns once every request taken has been answered, so a shutdown that drained
   the subscriptions (``drain``) answers what was delivered here before it closes the connection.
4. A serving responder's endpoints are subscribed once, by ``start``, in their queue groups; an
   endpoint declared after ``start`` is an error, not an endpoint that silently never serves.
5. A request whose reply subject its ``ReplyRule`` refuses (not the requester's inbox) is dropped
   before it is handled: never answered, never computed, counted by endpoint and reason, and logged
   at most once per interval. Every request/reply endpoint of the fleet is a responder's, so this is
   the one place that decides where an answer may go.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass

from faststream.nats import NatsResponse, NatsRouter
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from prometheus_client import Counter

from .admission import DeadlinePassed
from .replies import Inbound, RareWarning, ReplyRule, error_response, inbound

__all__ = ["Endpoint", "Handler", "Responder"]

log = logging.getLogger("ctxfleet.requests")
# Refusals come in floods when someone probes: one line per interval names the latest.
_REFUSAL_LOG_EVERY_S = 10.0

Handler = Callable[[Inbound], Awaitable[NatsResponse]]


class Responder:
    """Serves the request/reply endpoints of one process, each request in its own task."""

    def __init__(
        self,
        connection: Callable[[], NatsClient] | None,
        max_tasks: int,
        *,
        replies: ReplyRule | None = None,
        refused: Counter | None = None,
    ) -> None:
        # The connection the requests arrive on: the server lets a handler answer a requester's inbox
        # only there (``allow_responses``, infra/nats_accounts.py). None only where nothing is served
        # (the AsyncAPI document is built from the routers).
        self._connection = connection
        self._max_tasks = max_tasks
        self._replies = replies or ReplyRule()
        self._refused = refused
        self._refusals = RareWarning(
            _REFUSAL_LOG_EVERY_S, "dropped a request on %s unanswered: reply subject %r refused (%s)"
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._served: list[_Served] = []
        self._subscriptions: list[Subscription] | None = None

    @property
    def subjects(self) -> tuple[str, ...]:
        """The subjects a serving responder subscribes (or has subscribed), in declaration order."""
        return tuple(s.subject for s in self._served)

    @property
    def in_hand(self) -> int:
        return len(self._tasks)

    def endpoint(
        self,
        router: NatsRouter,
        subject: str,
        *,
        queue: str,
        title: str,
        max_tasks: int | None = None,
    ) -> Callable[[Handler], Handler]:
        """Declare ``subject`` on ``router``; the decorated handler answers each request (invariant 2).

        ``{tenant}`` in ``subject`` names the token the requester's tenant is read from (invariant 5);
        ``max_tasks`` bounds this endpoint below the responder's bound.
        """

        def register(handler: Handler) -> Handler:
            served = self.serving(handler, name=title, tenant_at=_tenant_token(subject), max_tasks=max_tasks)
            if self._connection is not None:
                if self._subscriptions is not None:
                    raise RuntimeError(f"endpoint {subject} declared after the responder started")
                self._served.append(_Served(_wildcards(subject), queue, served))
                return handler

            @router.subscriber(subject, queue=queue, decoder=inbound, no_reply=True, title=title)
            async def consume(message: Inbound) -> None:
                await served.take(message)

            return handler

        return register

    async def start(self) -> None:
        """Subscribe every endpoint in its queue group on the connection (invariant 4)."""
        if self._connection is None or self._subscriptions is not None:
            return
        nc = self._connection()
        self._subscriptions = []
        for served in self._served:
            self._subscriptions.append(
                await nc.subscribe(served.subject, queue=served.queue, cb=served.endpoint.deliver)
            )
        # Once the server has them: a process reported ready answers its first request.
        await nc.flush()

    async def drain(self) -> None:
        """Stop taking requests, take what was delivered here already, and answer all of it
        (invariant 3); the caller bounds it. New requests go to the other members of the queues."""
        subscriptions, self._subscriptions = self._subscriptions or [], []
        for subscription in subscriptions:
            try:
                await subscription.drain()  # type: ignore[no-untyped-call]
            except NatsError as exc:  # the connection is gone: nothing more is delivered here
                log.debug("drain %s: %s", subscription.subject, exc)
        await self.answered()

    def serving(
        self,
        handler: Handler,
        *,
        name: str = "",
        tenant_at: int | None = None,
        max_tasks: int | None = None,
    ) -> Endpoint:
        """One endpoint's bound on requests in hand and its reply rule, in front of ``handler``
        (invariants 1 and 5): ``name`` labels its refusals, ``tenant_at`` is the index of the subject
        token that holds the tenant."""
        return Endpoint(self, handler, min(max_tasks or self._max_tasks, self._max_tasks), name, tenant_at)

    async def answered(self) -> None:
        """Until every request taken so far has been answered (invariant 3); the caller bounds it."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _spawn(self, answer: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(answer)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuses(self, endpoint: str, tenant_at: int | None, message: Inbound) -> bool:
        """Whether ``message``'s reply subject is refused (invariant 5); counts and logs a refusal."""
        tenant = None if tenant_at is None else message.subject.split(".")[tenant_at]
        reason = self._replies.refusal(message.subject, tenant, message.reply)
        if reason is None:
            return False
        if self._refused is not None:
            self._refused.labels(endpoint=endpoint, reason=reason.value).inc()
        self._refusals.warn(message.subject, message.reply[:256], reason.value)
        return True

    async def _reply(self, message: Inbound, response: NatsResponse) -> None:
        if message.reply and self._connection is not None:
            nc = self._connection()
            await nc.publish(message.reply, _body(response), headers=response.headers or None)


class Endpoint:
    """The requests of one endpoint: at most ``max_tasks`` in hand, each answered in its own task."""

    def __init__(
        self, responder: Responder, handler: Handler, max_tasks: int, name: str, tenant_at: int | None
    ) -> None:
        self._responder = responder
        self._handler = handler
        self._name = name
        self._tenant_at = tenant_at
        # One bound per endpoint, as max_workers was: a flood of one kind does not starve the rest.
        self._slots = asyncio.Semaphore(max_tasks)

    async def take(self, message: Inbound) -> None:
        """Hand ``message`` to a task of its own; waits while ``max_tasks`` are in hand.

        A request whose answer may not go where it asks is dropped here, unhandled (invariant 5).
        """
        if message.reply and self._responder._refuses(self._name, self._tenant_at, message):
            return
        await self._slots.acquire()
        self._responder._spawn(self._answer(message))

    async def deliver(self, msg: Msg) -> None:
        """The subscription's callback: ``msg`` as the handlers take it, then ``take``."""
        await self.take(Inbound(msg.data, msg.subject, msg.headers or {}, msg.reply))

    async def _answer(self, message: Inbound) -> None:
        try:
            try:
                response = await self._handler(message)
            except DeadlinePassed:
                return  # the caller is gone: nobody reads an answer
            except Exception as exc:  # handlers answer their own errors; this is the last resort
                response = error_response(exc)
            await self._responder._reply(message, response)
        except Exception:  # a lost connection: the caller times out, as with any lost reply
            log.exception("could not answer a request on %s", message.subject)
        finally:
            self._slots.release()


@dataclass(frozen=True, slots=True)
class _Served:
    """An endpoint a serving responder subscribes: its NATS subject (wildcards), queue and bound."""

    subject: str
    queue: str
    endpoint: Endpoint


_PARAMETER = re.compile(r"\{[^}]+\}")


def _tenant_token(subject: str) -> int | None:
    """The index of ``subject``'s ``{tenant}`` token, if it has one."""
    tokens = subject.split(".")
    return tokens.index("{tenant}") if "{tenant}" in tokens else None


def _wildcards(subject: str) -> str:
    """``ctx.prepare.{tenant}.{run_id}`` as NATS subscribes it: each named token a ``*``."""
    return _PARAMETER.sub("*", subject)


def _body(response: NatsResponse) -> bytes:
    body = response.body
    if isinstance(body, bytes):
        return body
    raise TypeError(f"a reply body must be bytes, not {type(body).__name__}")
