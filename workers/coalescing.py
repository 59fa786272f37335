"""Per-thread work that is coalesced and backed by a catch-up sweep.

Notices may arrive many times while a thread is being worked on; they schedule exactly one more
pass. A periodic sweep finds threads whose notices were lost (a restart, an outage), so a notice
only ever decides *when* work happens, never *whether*. That is also what bounds a flood of them
(forged, or a recorder replaying a backlog): at most ``max_concurrent`` passes run at once, at
most ``max_pending`` threads wait, and a notice beyond that is dropped — the sweep, which reads
from the ledger which threads really moved, catches those up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from faststream.nats import NatsRouter

from contracts.subjects import RECORDED

from .replies import Inbound, inbound

__all__ = ["CoalescingScheduler", "CoalescingWorker", "recorded_notices"]


def recorded_notices(queue: str, description: str, schedule: Callable[[str], None]) -> NatsRouter:
    """A router that schedules the thread of every recorder notice, shared by queue group ``queue``."""
    router = NatsRouter()

    @router.subscriber(
        f"{RECORDED}.{{run_id}}.{{instance_id}}",
        queue=queue,
        decoder=inbound,
        # A notice is never answered, whatever reply subject it carries (workers/responder.py).
        no_reply=True,
        title=queue,
        description=description,
    )
    async def on_recorded(message: Inbound) -> None:
        run_id, instance_id = message.tokens(2)
        schedule(f"{run_id}.{instance_id}")

    return router


class CoalescingScheduler:
    """Runs ``work(thread_id)`` at most once at a time per thread, once more per notice during a run."""

    def __init__(
        self,
        work: Callable[[str], Awaitable[None]],
        sweep: Callable[[], Awaitable[list[str]]],
        log: logging.Logger,
        *,
        sweep_s: float = 2.0,
        max_concurrent: int = 8,
        max_pending: int = 4096,
        min_interval_s: float = 0.0,
        before_pass: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._work = work
        # Awaited before each pass takes a slot: prepares go first (workers/prepares_first.py).
        self._before_pass = before_pass
        self._find_stale = sweep
        self._log = log
        self._sweep_s = sweep_s
        self._slots = asyncio.Semaphore(max_concurrent)
        self._max_pending = max_pending
        self._min_interval_s = min_interval_s
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping = False
        self.dropped = 0
        # The last failure of each thread still failing: the same one again is not logged again (a
        # thread the sweep finds every round would log a line each round, for as long as it fails).
        self._failing: dict[str, str] = {}
        self.failures = 0

    def schedule(self, thread_id: str) -> None:
        """Work on ``thread_id`` soon (once more if it is being worked on)."""
        if self._stopping:
            return  # the next process catches up from the durable positions
        if thread_id in self._running:
            self._again.add(thread_id)
            return
        if len(self._running) >= self._max_pending:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                self._log.warning(
                    "%d notices dropped over %d threads waiting; the sweep catches up",
                    self.dropped,
                    self._max_pending,
                )
            return
        self._running[thread_id] = asyncio.create_task(self._run(thread_id))

    async def _run(self, thread_id: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._before_pass is not None:
                    await self._before_pass()
                async with self._slots:
                    self._again.discard(thread_id)
                    started = loop.time()
                    try:
                        await self._work(thread_id)
                    except Exception as exc:  # the sweep retries; this work is never on the hot path
                        self._failed(thread_id, exc)
                    else:
                        if self._failing.pop(thread_id, None) is not None:
                            self._log.info("%s: done again after failing", thread_id)
                if thread_id not in self._again or self._stopping:
                    return
                # A thread still being recorded into gets one more pass per interval, not one per
                # batch: the notices meanwhile collapse into it (the slot is free while it waits).
                delay = started + self._min_interval_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._stopping:
                    return
        finally:
            self._running.pop(thread_id, None)

    def _failed(self, thread_id: str, exc: Exception) -> None:
        self.failures += 1
        said = f"{type(exc).__name__}: {exc}"
        if self._failing.get(thread_id) == said:
            self._log.debug("%s: still failing: %s", thread_id, said)
            return
        if len(self._failing) >= self._max_pending:
            self._failing.pop(next(iter(self._failing)))
        self._failing[thread_id] = said
        self._log.warning("%s: %s (retried by the sweep; logged again only if it changes)", thread_id, said)

    @property
    def backlog(self) -> int:
        """Threads being worked on or waiting for another pass."""
        return len(self._running) + len(self._again - self._running.keys())

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep())

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop sweeping and scheduling; let running passes finish within ``grace_s``, then cancel them.

        A pass commits its effect with its position in one transaction, so a cancelled one rolls
        back and the next process (or this one's sweep after a restart) does it again: nothing is
        lost, and a long catch-up never holds a shutdown past its bound.
        """
        self._stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            # Bounded: a cancel lost in a client library's wait_for (Python 3.11) leaves the sweep to
            # end on the flag at its next round instead.
            await asyncio.wait({self._sweeper}, timeout=grace_s)
        running = list(self._running.values())
        if running:
            _, late = await asyncio.wait(running, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        self._again.clear()

    async def _sweep(self) -> None:
        while not self._stopping:
            try:
                for thread_id in await self._find_stale():
                    self.schedule(thread_id)
            except Exception as exc:  # the sweep is the safety net; keep it alive through outages
                self._log.warning("sweep: %s", exc)
            await asyncio.sleep(self._sweep_s)


class CoalescingWorker:
    """A worker that does per-thread work through a scheduler (none: documentation only, no servers)."""

    _scheduler: CoalescingScheduler | None

    def schedule(self, thread_id: str) -> None:
        """Work on ``thread_id`` soon (once more if it is being worked on)."""
        if self._scheduler is not None:
            self._scheduler.schedule(thread_id)

    @property
    def backlog(self) -> int:
        """Threads waiting for this worker (its ``ctx_consumer_lag_threads``)."""
        return self._scheduler.backlog if self._scheduler is not None else 0

    async def start(self) -> None:
        if self._scheduler is not None:
            self._scheduler.start()

    async def stop(self) -> None:
        if self._scheduler is not None:
            await self._scheduler.stop()
