"""Wake-ups for prepares waiting on a thread. In-process only; the shell feeds it.

A notice is a hint that a thread's ledger moved (a recorder committed, a compactor landed a summary).
It only wakes the waiters; every waiter then asks the ledger, so a lost or duplicated notice can
delay an answer (bounded by the waiter's re-check interval) but never decide it
(``services/app/freshness.py``).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, suppress
from typing import Protocol

__all__ = ["NO_PAUSE", "NoticeBoard", "Pause", "wait_for_notice"]


class Pause(Protocol):
    """What a request gives back while it only waits: the shell's compute slot, taken again after."""

    def released(self) -> AbstractAsyncContextManager[None]:
        """Hold no slot for the duration of the block."""
        ...


class _NoPause:
    @asynccontextmanager
    async def released(self) -> AsyncIterator[None]:
        yield


# For callers without admission control (tests, tools): waiting gives nothing back.
NO_PAUSE: Pause = _NoPause()


async def wait_for_notice(woken: asyncio.Event, timeout: float, pause: Pause) -> None:
    """Wait until ``woken`` is set or ``timeout`` seconds pass, holding no slot meanwhile.

    A waiting request must not keep an unrelated one from computing: ten prepares waiting out
    their ``wait_ms`` would otherwise fill the process's slots and starve everyone else.
    """
    async with pause.released():
        with suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), timeout=timeout)


class NoticeBoard:
    """Threads → the events of everyone waiting on them."""

    def __init__(self) -> None:
        self._waiters: defaultdict[str, list[asyncio.Event]] = defaultdict(list)

    @contextmanager
    def waiting(self, thread_id: str) -> Iterator[asyncio.Event]:
        """Register interest in a thread for the duration of the block."""
        event = asyncio.Event()
        self._waiters[thread_id].append(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(thread_id)
            if waiters is not None:
                waiters.remove(event)
                if not waiters:
                    del self._waiters[thread_id]

    def notify(self, thread_id: str) -> None:
        """``thread_id`` changed: wake everyone waiting on it."""
        for event in self._waiters.get(thread_id, ()):
            event.set()
