"""The level clock attributes the time between a thread's prepares to the earlier prepare's level."""

from __future__ import annotations

from contracts.windows import WaterLevel
from workers.level_clock import LevelClock


def test_level_clock_attributes_the_gap_to_the_previous_level() -> None:
    clock = LevelClock()
    assert clock.advance("r.a", WaterLevel.GREEN, 10.0) is None  # nothing before the first prepare
    assert clock.advance("r.a", WaterLevel.YELLOW, 12.5) == (WaterLevel.GREEN, 2.5)
    assert clock.advance("r.b", WaterLevel.RED, 13.0) is None  # threads are apart
    assert clock.advance("r.a", WaterLevel.YELLOW, 14.0) == (WaterLevel.YELLOW, 1.5)


def test_level_clock_forgets_the_least_recently_prepared_thread_first() -> None:
    clock = LevelClock(max_threads=2)
    clock.advance("r.a", WaterLevel.GREEN, 0.0)
    clock.advance("r.b", WaterLevel.GREEN, 0.0)
    clock.advance("r.a", WaterLevel.GREEN, 1.0)  # r.a is now the most recent
    clock.advance("r.c", WaterLevel.GREEN, 1.0)  # evicts r.b
    assert clock.advance("r.b", WaterLevel.GREEN, 2.0) is None  # and evicts r.a in turn
    assert clock.advance("r.c", WaterLevel.ORANGE, 3.0) == (WaterLevel.GREEN, 2.0)
