"""Prepares first: background passes of a process wait for its prepares in progress (issue 16).

The budgeter and the indexer of a process that also answers prepares (the embedded default runs
all five workers on one event loop) are woken by the same recorder notice as the prepare waiting
for that event. Their passes load and measure views and write the index — milliseconds of CPU
that, scheduled first, land inside the prepare's answer time. Their work is not urgent: a trigger
evaluated or a record indexed a few tens of milliseconds later changes nothing a caller sees.

Invariants:

1. A background pass starts only when no prepare of the process is in progress, or after waiting
   ``max_defer_s`` for that: prepares arriving back to back can delay it, never starve it.
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

__all__ = ["DEFAULT_MAX_DEFER_S", "HotPath"]

DEFAULT_MAX_DEFER_S = 0.1


class HotPath:
    """The prepares in progress in this process, and a wait for a moment without any."""

    def __init__(self, max_defer_s: float = DEFAULT_MAX_DEFER_S) -> None:
        self.max_defer_s = max_defer_s
        self._active = 0
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
            self._quiet.set()

    async def yield_to_prepares(self) -> None:
        """Return once no prepare is in progress, or after ``max_defer_s`` (invariant 1)."""
        if self._active == 0 or self.max_defer_s <= 0:
            return
        try:
            await asyncio.wait_for(self._quiet.wait(), timeout=self.max_defer_s)
        except TimeoutError:
            pass
