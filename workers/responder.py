"""Request/reply subscribers whose requests are answered from tasks of their own (issue 16).

A FastStream subscriber with ``max_workers`` hands each message through an anyio memory stream,
semaphore and task group: measured here, a 19 KB request/reply took 1.08–1.13 ms that way, 0.68–0.70
with FastStream consuming in order, and 0.44 with nats-py alone (``benchmarks`` probe, embedded
NATS, issue 16). So each request runs in a plain asyncio task that publishes its reply itself, and a
serving responder takes requests from nats-py subscriptions of its own (``start``): FastStream's
parser, middlewares and dependency injection were still 0.2–0.4 ms of every prepare (design D14.10).
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

from .admission import DeadlinePassed
from .replies import Inbound, error_response, inbound

__all__ = ["Endpoint", "Handler", "Responder"]

log = logging.getLogger("ctxfleet.requests")

Handler = Callable[[Inbound], Awaitable[NatsResponse]]


class Responder:
    """Serves the request/reply endpoints of one process, each request in its own task."""

    def __init__(self, connection: Callable[[], NatsClient] | None, max_tasks: int) -> None:
        # The connection the requests arrive on: the server lets a handler answer a requester's inbox
        # only there (``allow_responses``, infra/nats_accounts.py). None only where nothing is served
        # (the AsyncAPI document is built from the routers).
        self._connection = connection
        self._max_tasks = max_tasks
        self._tasks: set[asyncio.Task[None]] = set()
        self._served: list[_Served] = []
        self._subscriptions: list[Subscription] | None = None

    @property
    def subjects(self) -> tuple[str, ...]:
        """The subjects a serving responder subscribes (or has subscribed), in declaration order."""
        return tuple(s.subject for s in self._served)

    @property
    def in_hand(self) -> int:
        """Requests taken and not answered yet."""
        return len(self._tasks)

    def endpoint(
        self, router: NatsRouter, subject: str, *, queue: str, title: str, description: str
    ) -> Callable[[Handler], Handler]:
        """Declare ``subject`` on ``router``; the decorated handler answers each request (invariant 2)."""

        def register(handler: Handler) -> Handler:
            served = self.serving(handler)
            if self._connection is not None:
                if self._subscriptions is not None:
                    raise RuntimeError(f"endpoint {subject} declared after the responder started")
                self._served.append(_Served(_wildcards(subject), queue, served))
                return handler

            @router.subscriber(
                subject, queue=queue, decoder=inbound, no_reply=True, title=title, description=description
            )
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

    def serving(self, handler: Handler) -> Endpoint:
        """One endpoint's bound on requests in hand, in front of ``handler`` (invariant 1)."""
        return Endpoint(self, handler, self._max_tasks)

    async def answered(self) -> None:
        """Until every request taken so far has been answered (invariant 3); the caller bounds it."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _spawn(self, answer: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(answer)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reply(self, message: Inbound, response: NatsResponse) -> None:
        if message.reply and self._connection is not None:
            nc = self._connection()
            await nc.publish(message.reply, _body(response), headers=response.headers or None)


class Endpoint:
    """The requests of one endpoint: at most ``max_tasks`` in hand, each answered in its own task."""

    def __init__(self, responder: Responder, handler: Handler, max_tasks: int) -> None:
        self._responder = responder
        self._handler = handler
        # One bound per endpoint, as max_workers was: a flood of one kind does not starve the rest.
        self._slots = asyncio.Semaphore(max_tasks)

    async def take(self, message: Inbound) -> None:
        """Hand ``message`` to a task of its own; waits while ``max_tasks`` are in hand."""
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


def _wildcards(subject: str) -> str:
    """``ctx.prepare.{tenant}.{run_id}`` as NATS subscribes it: each named token a ``*``."""
    return _PARAMETER.sub("*", subject)


def _body(response: NatsResponse) -> bytes:
    body = response.body
    if isinstance(body, bytes):
        return body
    raise TypeError(f"a reply body must be bytes, not {type(body).__name__}")
