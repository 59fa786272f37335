"""Windows: how a thread's context runs in windows, and the water levels that decide when one closes.

Seed 004 §22–36: the window is not memory and can be dropped at any time; the task is rebuilt
from state. A policy chooses the strategy — ``summary`` keeps one window and summarizes its
history (what the fleet always did), ``rollover`` closes a full window at a safe boundary with a
``WindowHandoff`` and serves the next one from state. The four water levels are shares of the
input budget (seed 004 §31).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from ._base import WireModel
from .forecasts import ForecastPolicy

__all__ = ["WaterLevel", "WaterLevels", "WindowPolicy", "WindowStrategy"]

_Share = Annotated[float, Field(gt=0.0, lt=1.0)]


class WaterLevel(StrEnum):
    """How full the window is (seed 004 §31)."""

    # Normal running.
    GREEN = "green"
    # Start leaving out low-value optional material.
    YELLOW = "yellow"
    # Prepare the handoff.
    ORANGE = "orange"
    # No ordinary model call in this window: it rolls over.
    RED = "red"


class WindowStrategy(StrEnum):
    """What a thread does when its window fills."""

    SUMMARY = "summary"
    ROLLOVER = "rollover"


class WaterLevels(WireModel):
    """Thresholds as shares of the input budget; each level starts at its threshold (``>=``)."""

    yellow: _Share = 0.60
    orange: _Share = 0.75
    red: _Share = 0.90

    @model_validator(mode="after")
    def _ascending(self) -> WaterLevels:
        if not self.yellow < self.orange < self.red:
            raise ValueError(
                "water levels must ascend: "
                f"yellow ({self.yellow}) < orange ({self.orange}) < red ({self.red})"
            )
        return self

    def level_of(self, used: int, budget: int) -> WaterLevel:
        """The level of ``used`` tokens out of ``budget``."""
        share = used / budget if budget > 0 else 1.0
        if share >= self.red:
            return WaterLevel.RED
        if share >= self.orange:
            return WaterLevel.ORANGE
        if share >= self.yellow:
            return WaterLevel.YELLOW
        return WaterLevel.GREEN

    def safe_remaining(self, used: int, budget: int) -> int:
        """Tokens left before the red line: the room an ordinary step may still use."""
        return max(0, int(budget * self.red) - used)


class WindowPolicy(WireModel):
    """The window strategy of a policy and its water levels."""

    strategy: WindowStrategy = WindowStrategy.SUMMARY
    levels: WaterLevels = Field(default_factory=WaterLevels)
    # How the forecast of the coming steps is computed (seed 004 §30): reported, and D's rollover trigger.
    forecast: ForecastPolicy = Field(default_factory=ForecastPolicy)
