"""Time per water level: how long each thread's window stood at each level, between its prepares.

A thread's window changes level only when a prepare measures it, so the time from one prepare to
the thread's next is attributed to the level the first one reported. Kept per process for a
bounded number of threads (the least recently prepared are forgotten first): a thread whose
prepares alternate between assembler replicas is counted only for the gaps one replica saw.
"""

from __future__ import annotations

from collections import OrderedDict

from contracts.windows import WaterLevel

__all__ = ["LevelClock"]


class LevelClock:
    """The last level and time of each recently prepared thread."""

    def __init__(self, max_threads: int = 10_000) -> None:
        self._max = max_threads
        self._last: OrderedDict[str, tuple[WaterLevel, float]] = OrderedDict()

    def advance(self, thread_id: str, level: WaterLevel, now: float) -> tuple[WaterLevel, float] | None:
        """Record ``level`` at ``now``; the previous level and the seconds it lasted, if known."""
        previous = self._last.pop(thread_id, None)
        self._last[thread_id] = (level, now)
        if len(self._last) > self._max:
            self._last.popitem(last=False)
        if previous is None:
            return None
        return previous[0], max(0.0, now - previous[1])
