"""Prepares first: a background pass of a process starts once none of its prepares is in progress.

The budgeter and the indexer of a process that also answers prepares (the embedded default runs all
five workers on one event loop) are woken by the recorder notice that wakes the prepare waiting for
that event. Their passes load and measure a view or write the index: milliseconds of CPU and
statements that, run then, land inside that prepare's answer. Nothing a caller sees depends on a pass
running a few milliseconds later, so a pass waits until no prepare of its process is in progress, for
``max_wait_s`` at most: a process that is never without a prepare still runs its passes.

A prepare counts as in progress until its reply is on its way: the count drops one loop turn after
its handler returns, so the reply's write is scheduled ahead of the passes it lets start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DEFAULT_MAX_WAIT_S", "PreparesFirst"]

# Coalesced passes run at most every 0.25 s per thread anyway; a second more changes no decision.
DEFAULT_MAX_WAIT_S = 1.0


class PreparesFirst:
    """The prepares in progress in one process, and a wait for a moment without any."""

    def __init__(self, max_wait_s: float = DEFAULT_MAX_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._in_progress = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_progress(self) -> int:
        """Prepares being answered (computing, queued for a slot or waiting for their event)."""
        return self._in_progress

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Count one prepare as in progress for the block, and until its reply's write is scheduled."""
        self._in_progress += 1
        self._idle.clear()
        try:
            yield
        finally:
            asyncio.get_running_loop().call_soon(self._answered)

    def _answered(self) -> None:
        self._in_progress -= 1
        if self._in_progress == 0:
            self._idle.set()

    async def before_pass(self) -> None:
        """Return once no prepare is in progress, or after ``max_wait_s``."""
        if self._in_progress == 0:
            return
        idle = asyncio.ensure_future(self._idle.wait())
        _, pending = await asyncio.wait((idle,), timeout=self.max_wait_s)
        for waiting in pending:
            waiting.cancel()
