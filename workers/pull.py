"""A partition's events as soon as they are stored: one pull request kept open, its deliveries handed
out at once.

Why not nats-py's ``fetch(n, timeout)``: once the first message of a pull has arrived it waits for the
rest of ``n`` until its timeout. Measured with 50 agents stepping every 1.5 s: an event acked in 1.5
ms sat in the recorder's fetch for up to 0.5–1 s (the pull's window), the whole tail of the agent-like
benchmark. A fetch of one message has no such wait but makes a round trip per event.

Here, like nats.go's ``Consume``: a pull request for up to ``batch`` messages stays open on the server
with an expiry and idle heartbeats, its deliveries land in this object's own inbox, and
:meth:`next_batch` awaits the first one and takes whatever else is already there — never waiting for
more. A new request goes out when the open one is used up or ended (status 404/408). Deliveries are
in consumer order on one subscription, so the recorder's gap check holds as before.

Invariants:

1. At most one pull request of this object is open on the server, and its inbox subscription lives
   as long as the object: nothing is delivered where nobody reads.
2. A delivery is handed out by the first :meth:`next_batch` after it arrived, in arrival order.
3. Silence longer than three heartbeats means the request may be gone (a server restart, a deleted
   consumer): the server is asked about the consumer, and unless it answers that the consumer is
   there, :meth:`next_batch` raises :class:`PullStalled` and the caller rebuilds the consumer. A
   server too busy to send heartbeats (a burst of synced publishes) does not cost a rebuild.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

__all__ = ["ContinuousPull", "PullStalled"]

_STATUS = "Status"
_DESCRIPTION = "Description"
# Statuses that end the open request without ending the consumer: no messages (no_wait), expired.
_REQUEST_ENDED = frozenset({"404", "408"})
_HEARTBEAT = "100"


class PullStalled(NatsError):
    """The server stopped answering the open pull request, or refused it; rebuild the consumer."""


class ContinuousPull:
    """Keeps one pull request open on an ack-less consumer and hands out its deliveries at once."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        stream: str,
        consumer: str,
        batch: int,
        expires_s: float = 5.0,
        heartbeat_s: float = 0.25,
        api_prefix: str = "$JS.API",
    ) -> None:
        self._nc = nc
        self._next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._info_subject = f"{api_prefix}.CONSUMER.INFO.{stream}.{consumer}"
        self._batch = batch
        self._expires_s = expires_s
        self._heartbeat_s = heartbeat_s
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._arrived: deque[Msg] = deque()
        self._wake = asyncio.Event()
        # Messages the open request may still deliver; 0: no request open.
        self._left = 0
        self._last_heard = time.monotonic()
        self._failure: str | None = None

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_msg)
        await self._request()

    async def stop(self) -> None:
        """Unsubscribe; the server drops the open request when it expires."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()

    async def next_batch(self, timeout: float) -> list[Msg]:
        """What arrived, at least one message and at most ``batch``, in order.

        Raises:
            TimeoutError: nothing arrived within ``timeout`` (the request is still open and heard from).
            PullStalled: the server refused the request or went silent (invariant 3).
        """
        deadline = time.monotonic() + timeout
        if self._left <= 0:
            # The open request is used up: ask for more before the caller applies what it has, so the
            # server delivers the next batch while this one is being written (a backlog streams).
            await self._request()
        while True:
            # Cleared before looking, so a delivery between the look and the wait still wakes us.
            self._wake.clear()
            if self._arrived:
                break
            self._check_failure()
            if self._left <= 0:
                await self._request()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=min(remaining, self._heartbeat_s))
                continue
            except TimeoutError:
                pass
            # Judged only after a wait: heartbeats that came in while the caller was busy are counted.
            silent = time.monotonic() - self._last_heard
            if silent > 3 * self._heartbeat_s:
                await self._confirm_alive(silent)
        out: list[Msg] = []
        while self._arrived and len(out) < self._batch:
            out.append(self._arrived.popleft())
        return out

    async def _confirm_alive(self, silent: float) -> None:
        """Ask the server about the consumer after a silence; raises :class:`PullStalled` unless it
        answers that the consumer is there.

        A server busy writing a burst of publishes (each one synced to disk) sent no heartbeat for
        0.8 s while the consumer was fine: every partition of the ingest benchmark's worker rebuilt
        its consumer twice before reading the first event. A server restart or a deleted consumer
        still ends the pull at once: the question times out or is answered "not found".
        """
        try:
            reply = await self._nc.request(self._info_subject, b"", timeout=4 * self._heartbeat_s)
            info = json.loads(reply.data)
        except (NatsError, TimeoutError, ValueError) as exc:
            raise PullStalled(
                f"no delivery or heartbeat on {self._next_subject} for {silent:.1f}s "
                f"and no answer about its consumer ({type(exc).__name__})"
            ) from None
        if not isinstance(info, dict) or "error" in info:
            error = info.get("error") if isinstance(info, dict) else info
            raise PullStalled(f"no delivery or heartbeat on {self._next_subject} for {silent:.1f}s: {error}")
        self._last_heard = time.monotonic()
        if not info.get("num_waiting"):
            # The consumer is there but holds no request (this object is its only reader): ours ended
            # unheard, so open the next one (invariant 1 holds: none is open).
            await self._request()

    async def _request(self) -> None:
        request = {
            "batch": self._batch,
            "expires": int(self._expires_s * 1_000_000_000),
            "idle_heartbeat": int(self._heartbeat_s * 1_000_000_000),
        }
        self._left = self._batch
        # A new request is a fresh start for the silence rule: its first heartbeat is due in one beat.
        self._last_heard = time.monotonic()
        await self._nc.publish(self._next_subject, json.dumps(request).encode(), reply=self._inbox)

    async def _on_msg(self, msg: Msg) -> None:
        self._last_heard = time.monotonic()
        status = msg.headers.get(_STATUS) if msg.headers else None
        if status is None:
            self._arrived.append(msg)
            self._left -= 1
        elif status in _REQUEST_ENDED:
            self._left = 0
        elif status != _HEARTBEAT:
            description = msg.headers.get(_DESCRIPTION, "") if msg.headers else ""
            self._failure = f"{status} {description}".strip()
        self._wake.set()

    def _check_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise PullStalled(f"pull request on {self._next_subject} refused: {failure}")
