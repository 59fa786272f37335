"""Prepares first: background passes of a process wait for its prepares in progress.

The budgeter and the indexer of a process that also answers prepares (the embedded default runs
all five workers on one event loop) are woken by the same recorder notice as the prepare waiting
for that event. Their passes load and measure views and write the index — milliseconds of CPU
that, scheduled first, land inside the prepare's answer time. Their work is not urgent: a trigger
evaluated or a record indexed a few tens of milliseconds later changes nothing a caller sees.

Invariants:

1. Short background work (the gateway's write-behind, the backlog gauges) starts only when no
   prepare of the process is in progress, or after waiting ``max_defer_s`` for that
   (``yield_to_prepares``): prepares arriving back to back can delay it, never starve it.
1a. A budgeter or indexer pass (milliseconds of CPU: a view measured, records indexed), and the heap
   keeper's collection of what the last interval allocated (workers/heap.py), wait for a quiet moment
   instead: no prepare in progress and none answered for ``quiet_s`` — an agent's think
   time — or ``pass_defer_s`` at most (``await_quiet``). Between the steps of an agent that does not
   think, a moment without a prepare lasts ~3 ms: a pass started there ran on into the next step
   (measured: a 0 s-pause step p99 of 27 ms against a p50 of 8). Waiting for a real pause
   gathers the passes of a busy loop into one per ``pass_defer_s`` at most.
1b. ``yield_to_prepares`` suspends at least once even when no prepare is in progress: work done in
   short pieces, each after a call, holds the event loop for one piece at a time, and a request read
   meanwhile is served between two pieces. (Returning at once let the gateway's write-behind hash 40
   queued records, 12.5 ms, in one go while a back-to-back agent's next event waited behind it.)
2. A prepare never waits for background work; the gate only delays the start of passes.
3. A prepare counts as in progress until its reply is on its way: the count drops one loop turn
   after the handler returns. FastStream publishes the handler's reply right after it returns, and
   nats-py's flusher task, which writes it to the socket, is woken then; passes woken in the same
   turn would run ahead of that write and hold the reply back by their milliseconds of CPU
   (measured: 2.8 ms of a read-your-writes step between the reply built and the client reading it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DEFAULT_MAX_DEFER_S", "DEFAULT_PASS_DEFER_S", "DEFAULT_QUIET_S", "HotPath"]

DEFAULT_MAX_DEFER_S = 0.1
DEFAULT_PASS_DEFER_S = 1.0
DEFAULT_QUIET_S = 0.01


class HotPath:
    """The prepares in progress in this process, and a wait for a moment without any."""

    def __init__(
        self,
        max_defer_s: float = DEFAULT_MAX_DEFER_S,
        *,
        quiet_s: float = DEFAULT_QUIET_S,
        pass_defer_s: float = DEFAULT_PASS_DEFER_S,
    ) -> None:
        self.max_defer_s = max_defer_s
        self.quiet_s = quiet_s
        self.pass_defer_s = pass_defer_s
        self._active = 0
        # When the last prepare in progress was answered (loop time); -inf: never.
        self._answered_at = float("-inf")
        self._quiet = asyncio.Event()
        self._quiet.set()

    @property
    def active(self) -> int:
        """Prepares in progress (computing, queued for a slot or waiting for their event)."""
        return self._active

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Count one prepare as in progress for the block."""
        self._active += 1
        self._quiet.clear()
        try:
            yield
        finally:
            # Invariant 3: the reply's write is scheduled before any pass is woken.
            asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._answered_at = asyncio.get_running_loop().time()
            self._quiet.set()

    async def yield_to_prepares(self) -> None:
        """Return once no prepare is in progress, or after ``max_defer_s`` (invariants 1, 1b)."""
        if self._active == 0 or self.max_defer_s <= 0:
            await asyncio.sleep(0)
            return
        try:
            await asyncio.wait_for(self._quiet.wait(), timeout=self.max_defer_s)
        except TimeoutError:
            pass

    async def await_quiet(self) -> None:
        """Return once no prepare is in progress and none was answered for ``quiet_s``, or after
        ``pass_defer_s`` (invariant 1a)."""
        if self.pass_defer_s <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.pass_defer_s
        while (remaining := deadline - loop.time()) > 0:
            if self._active:
                try:
                    await asyncio.wait_for(self._quiet.wait(), timeout=remaining)
                except TimeoutError:
                    return
                continue
            still = self._answered_at + self.quiet_s - loop.time()
            if still <= 0:
                return
            await asyncio.sleep(min(still, remaining))
