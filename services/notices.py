"""Wake-ups for prepares waiting on their watermark. In-process only; the shell feeds it.

A notice is a hint that a thread's ledger moved; waiters always re-check the database, so a lost
or duplicated notice can delay an answer (bounded by the re-check interval) but never falsify it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["NoticeBoard"]


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
        """Wake everyone waiting on ``thread_id``."""
        for event in self._waiters.get(thread_id, ()):
            event.set()

    @property
    def waiting_threads(self) -> int:
        """How many threads have waiters (for metrics)."""
        return len(self._waiters)
