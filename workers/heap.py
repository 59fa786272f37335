"""Keeps the garbage collector's full collections off the hot path.

A full collection walks every tracked object the process holds, and the view cache holds hundreds
of MB of them: 200–500 ms with the event loop stopped, every few hundred prepares. What
has lived through a freeze interval is almost always cache or connection state, so it is frozen
(``gc.freeze``: a list splice, no walk) and the collector's generations hold only what recent
requests allocated. Refcounting still frees frozen objects the moment nothing holds them — an
evicted cache entry is freed as before; only garbage *cycles* that were frozen wait, for the sweep
(unfreeze, one full collection, freeze again) once per ``sweep_interval_s``.

Full collections are the keeper's alone. Left to the allocator, one starts at whatever allocation
crosses its threshold — a prepare's included — and walks everything allocated since the last freeze:
22–50 ms in the middle of an agent's step after a few threads' views were built (one in
each 300-step run, the step's p99). So the allocator's own full collections are turned off (young
ones stay, they are short), and at each interval the keeper collects what is not frozen in a quiet
moment, then freezes what survived: cycles of the interval are freed before they are frozen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
import gc
import logging
import time

__all__ = ["HeapKeeper"]

log = logging.getLogger("ctxfleet.heap")

# The collector's third threshold: young collections before the allocator starts a full one. This many
# is never reached between two of the keeper's intervals.
_NO_AUTOMATIC_FULL = 1_000_000_000


class _FullCollections:
    """Who turned the allocator's full collections off: the thresholds come back when the last keeper
    of the process stops (tests run several fleets in one process)."""

    def __init__(self) -> None:
        self._keepers = 0
        self._saved: tuple[int, int, int] | None = None

    def take(self) -> None:
        if self._keepers == 0:
            young, middle, full = self._saved = gc.get_threshold()
            gc.set_threshold(young, middle, max(full, _NO_AUTOMATIC_FULL))
        self._keepers += 1

    def give_back(self) -> None:
        self._keepers -= 1
        if self._keepers == 0 and self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None


_FULL = _FullCollections()


class HeapKeeper:
    """Collects and freezes what survived each interval; sweeps frozen cycles once per sweep interval."""

    def __init__(
        self,
        freeze_interval_s: float,
        sweep_interval_s: float,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        # Awaited before each collection (milliseconds; a sweep tens of ms): not while an agent's step
        # is being answered.
        self._quiet = quiet
        self._freeze_s = freeze_interval_s
        self._sweep_s = sweep_interval_s
        self._task: asyncio.Task[None] | None = None
        self.freezes = 0
        self.sweeps = 0

    def start(self) -> None:
        """Take full collections over from the allocator, and run them on the interval."""
        if self._freeze_s > 0 and self._task is None:
            _FULL.take()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="heap-keeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            _FULL.give_back()

    def freeze(self) -> float:
        """Collect what is not frozen, then freeze what survived; returns the pause in seconds."""
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.freezes += 1
        return time.perf_counter() - started

    def sweep(self) -> float:
        """Collect everything once, frozen objects included; returns the pause in seconds."""
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.sweeps += 1
        return time.perf_counter() - started

    async def _run(self) -> None:
        next_sweep = time.monotonic() + self._sweep_s
        while True:
            await asyncio.sleep(self._freeze_s)
            if self._quiet is not None:
                await self._quiet()
            if time.monotonic() >= next_sweep:
                pause = self.sweep()
                next_sweep = time.monotonic() + self._sweep_s
                log.info("heap sweep: %.0f ms, %d objects frozen", pause * 1000, gc.get_freeze_count())
            else:
                self.freeze()
