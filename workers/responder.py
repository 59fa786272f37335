"""Request/reply subscribers whose requests are answered from tasks of their own (issue 16).

A FastStream subscriber with ``max_workers`` hands each message through an anyio memory stream,
semaphore and task group: measured here, a 19 KB request/reply took 1.08–1.13 ms that way, 0.68–0.70
with FastStream consuming in order, and 0.44 with nats-py alone (``benchmarks`` probe, embedded
NATS, issue 16). So a request/reply endpoint is still declared with FastStream (its decoder, the
AsyncAPI document), but consumes in order with FastStream's own reply turned off (``no_reply``), and
each request runs in a plain asyncio task that publishes its reply itself.

Invariants:

1. At most ``max_tasks`` requests of one endpoint are in hand at once; the next one waits in the
   consume loop (then in the client library's buffer), as it did behind ``max_workers``. What bounds
   computing is admission's slots (``workers/admission.py``), not this.
2. A request is answered at most once: with its handler's response; with the typed error of what
   the handler raised; or not at all when the caller's deadline passed (``DeadlinePassed``) or the
   request named no reply subject.
3. ``answered()`` returns once every request taken has been answered, so a shutdown that drained
   the subscriptions answers what was delivered here before it closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine

from faststream.nats import NatsResponse, NatsRouter
from nats.aio.client import Client as NatsClient

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

            @router.subscriber(
                subject, queue=queue, decoder=inbound, no_reply=True, title=title, description=description
            )
            async def consume(message: Inbound) -> None:
                await served.take(message)

            return handler

        return register

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


def _body(response: NatsResponse) -> bytes:
    body = response.body
    if isinstance(body, bytes):
        return body
    raise TypeError(f"a reply body must be bytes, not {type(body).__name__}")
