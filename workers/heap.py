"""Keeps the garbage collector's full collections off the hot path.

A full collection walks every tracked object the process holds, and the view cache holds hundreds
of MB of them: 200–500 ms with the event loop stopped, every few hundred prepares (issue 16). What
has lived through a freeze interval is almost always cache or connection state, so it is frozen
(``gc.freeze``: a list splice, no walk) and the collector's generations hold only what recent
requests allocated. Refcounting still frees frozen objects the moment nothing holds them — an
evicted cache entry is freed as before; only garbage *cycles* that were frozen wait, for the sweep
(unfreeze, one full collection, freeze again) once per ``sweep_interval_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
import gc
import logging
import time

__all__ = ["HeapKeeper"]

log = logging.getLogger("ctxfleet.heap")


class HeapKeeper:
    """Freezes what survived each interval; sweeps frozen cycles once per sweep interval."""

    def __init__(
        self,
        freeze_interval_s: float,
        sweep_interval_s: float,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        # Awaited before a sweep (a full collection, tens of ms): not while a prepare is being answered.
        self._quiet = quiet
        self._freeze_s = freeze_interval_s
        self._sweep_s = sweep_interval_s
        self._task: asyncio.Task[None] | None = None
        self.freezes = 0
        self.sweeps = 0

    def start(self) -> None:
        if self._freeze_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="heap-keeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def freeze(self) -> None:
        gc.freeze()
        self.freezes += 1

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
            if time.monotonic() >= next_sweep:
                if self._quiet is not None:
                    await self._quiet()
                pause = self.sweep()
                next_sweep = time.monotonic() + self._sweep_s
                log.info("heap sweep: %.0f ms, %d objects frozen", pause * 1000, gc.get_freeze_count())
            else:
                self.freeze()
