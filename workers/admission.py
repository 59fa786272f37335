"""Admission control of request/reply: a bounded number of requests compute at once per process.

Invariants:

1. At most ``max_inflight`` requests hold a slot; a request that only waits (for its event or a
   compaction) gives its slot back and takes it again, ahead of new arrivals, to finish.
2. Beyond the slots, at most ``max_queued`` requests queue, each for at most ``max_queue_age_ms``;
   any other is answered ``overloaded`` at once, with a ``retry_after_ms`` hint.
3. A request whose caller's deadline (header ``ctx-deadline-ms``) passed before it got a slot is
   dropped: never processed, never answered. A request without the header is served as before.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from faststream.exceptions import SkipMessage

from ctxfleet_client.client import DEADLINE_HEADER
from contracts.exceptions import Overloaded

from .metrics import FleetMetrics

__all__ = ["Admission", "DeadlinePassed", "RequestLimits", "Slot", "deadline_of"]

# Bounds of the retry hint: soon enough to be useful, late enough not to come straight back.
_MIN_RETRY_MS = 50
_MAX_RETRY_MS = 5_000
# Weight of the newest slot hold time in the running mean the hint is computed from.
_EWMA_WEIGHT = 0.1


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """How many requests compute at once, and how many may queue for how long."""

    max_inflight: int = 64
    max_queue_age_ms: int = 500
    # Queue bound as a multiple of the slots: a deeper queue only turns overloaded into timeouts.
    queue_factor: int = 4

    @property
    def max_queued(self) -> int:
        """Requests that may wait for a slot before new ones are refused at once."""
        return self.max_inflight * self.queue_factor

    @property
    def max_tasks(self) -> int:
        """Requests one subscriber hands to handlers at once (computing, queued or waiting).

        Well above the slots, so a request is refused by us (typed, at once) rather than left in the
        client library's buffer; what bounds computing is the slots, not this.
        """
        return max(256, 4 * (self.max_inflight + self.max_queued))


class DeadlinePassed(SkipMessage):
    """The caller's deadline passed before the request got a slot: drop it, answer nothing."""


def deadline_of(headers: Mapping[str, str] | None) -> int | None:
    """The caller's deadline (epoch milliseconds) from the request headers, if it sent a valid one."""
    raw = (headers or {}).get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:  # a malformed header must not make a request unservable
        return None


class Slot:
    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.held = True
        self.paused_s = 0.0

    @asynccontextmanager
    async def released(self) -> AsyncIterator[None]:
        """Give the slot back for the block (a wait), then take it again ahead of new arrivals."""
        a = self._admission
        self.held = False
        a.give_back()
        a.waiting += 1
        a.publish_gauges()
        paused = a.monotonic()
        try:
            yield
        finally:
            a.waiting -= 1
            self.paused_s += a.monotonic() - paused
            await a.take_again()
            self.held = True


class Admission:
    """The compute slots of one process, shared by every request/reply endpoint."""

    def __init__(
        self,
        limits: RequestLimits,
        metrics: FleetMetrics,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], float] = lambda: time.time() * 1000,
    ) -> None:
        self.limits = limits
        self._metrics = metrics
        self.monotonic = monotonic
        self._wall_ms = wall_ms
        self._free = limits.max_inflight
        # FIFO of queued requests; a request coming back from a wait is put first.
        self._queue: deque[asyncio.Future[None]] = deque()
        self._mean_hold_s = 0.01
        self.waiting = 0

    @asynccontextmanager
    async def slot(self, headers: Mapping[str, str] | None) -> AsyncIterator[Slot]:
        """Hold a slot for the block.

        Raises:
            DeadlinePassed: the caller gave up already (FastStream then sends no reply).
            Overloaded: no slot within the queue bounds; the reply carries ``retry_after_ms``.
        """
        deadline = deadline_of(headers)
        self._drop_if_expired(deadline)
        await self._take(deadline)
        started = self.monotonic()
        holder = Slot(self)
        try:
            self._drop_if_expired(deadline)
            yield holder
        finally:
            if holder.held:
                self.give_back()
            # Compute time only: the retry hint is about slots, and a waiter held none.
            held = self.monotonic() - started - holder.paused_s
            self._mean_hold_s += _EWMA_WEIGHT * (held - self._mean_hold_s)
            self.publish_gauges()

    def _drop_if_expired(self, deadline: int | None) -> None:
        if deadline is not None and self._wall_ms() >= deadline:
            self._metrics.requests_rejected.labels(reason="deadline").inc()
            raise DeadlinePassed(f"caller's deadline {deadline} passed")

    async def _take(self, deadline: int | None) -> None:
        if self._free > 0 and not self._queue:
            self._free -= 1
            self.publish_gauges()
            self._metrics.request_queue_seconds.observe(0.0)
            return
        if len(self._queue) >= self.limits.max_queued:
            raise self._refuse("queue_full")
        age_s = self.limits.max_queue_age_ms / 1000
        if deadline is not None:  # no point queueing past the moment the caller stops listening
            age_s = min(age_s, max(0.0, (deadline - self._wall_ms()) / 1000))
        started = self.monotonic()
        if not await self._queued(age_s, front=False):
            self._drop_if_expired(deadline)  # the caller is gone: nobody to tell it is overloaded
            raise self._refuse("queue_age")
        self._metrics.request_queue_seconds.observe(self.monotonic() - started)

    async def _queued(self, timeout_s: float | None, *, front: bool) -> bool:
        """Wait in the queue for a slot handed over by ``give_back``; False when ``timeout_s`` passed."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if front:
            self._queue.appendleft(turn)
        else:
            self._queue.append(turn)
        self.publish_gauges()
        try:
            await asyncio.wait((turn,), timeout=timeout_s)
        except BaseException:
            self._leave(turn)
            raise
        if turn.done():
            return True
        self._leave(turn)
        return False

    def _leave(self, turn: asyncio.Future[None]) -> None:
        if turn.done() and not turn.cancelled():
            self.give_back()  # handed a slot just as we gave up: pass it on
        else:
            turn.cancel()
            if turn in self._queue:
                self._queue.remove(turn)
        self.publish_gauges()

    async def take_again(self) -> None:
        """Take a slot after a wait, ahead of new arrivals and with no age limit (already admitted)."""
        if self._free > 0 and not self._queue:
            self._free -= 1
        else:
            await self._queued(None, front=True)
        self.publish_gauges()

    def give_back(self) -> None:
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1

    def _refuse(self, reason: str) -> Overloaded:
        self._metrics.requests_rejected.labels(reason=reason).inc()
        limit = self.limits.max_inflight
        # Roughly when the queue ahead will have drained through the slots.
        estimate = self._mean_hold_s * 1000 * (len(self._queue) + 1) / limit
        return Overloaded(int(min(_MAX_RETRY_MS, max(_MIN_RETRY_MS, estimate))), reason, limit)

    def publish_gauges(self) -> None:
        m = self._metrics
        m.inflight_requests.set(self.limits.max_inflight - self._free)
        m.queued_requests.set(len(self._queue))
        m.waiting_requests.set(self.waiting)
