"""Windows: how a thread's context runs in windows, and the water levels that decide when one closes.

Seed 004 §22–36: the window is not memory and can be dropped at any time; the task is rebuilt
from state. A policy chooses the strategy — ``summary`` keeps one window and summarizes its
history (what the fleet always did), ``rollover`` closes a full window at a safe boundary with a
``WindowHandoff`` and serves the next one from state. The four water levels are shares of the
input budget.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from ._base import SchemaVersion, WireModel
from .forecasts import ForecastPolicy

__all__ = [
    "RolloverReport",
    "RolloverTrigger",
    "WaterLevel",
    "WaterLevels",
    "WindowHandoff",
    "WindowPolicy",
    "WindowStrategy",
]

_Share = Annotated[float, Field(gt=0.0, lt=1.0)]


class WaterLevel(StrEnum):
    """How full the window is."""

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


class RolloverTrigger(StrEnum):
    """Why a window closes (five triggers)."""

    # The window reached its red line.
    HARD_LIMIT = "hard_limit"
    # What the next steps are expected to need no longer fits under the red line.
    FORECAST = "forecast"
    # The task moved to another phase: it needs another composition of context.
    PHASE_BOUNDARY = "phase_boundary"
    # Most of the window is low-value material (old tool outputs).
    SEMANTIC_DENSITY = "semantic_density"
    # A stable checkpoint was reached: the next stage starts clean.
    RECOVERY_BOUNDARY = "recovery_boundary"


class WindowPolicy(WireModel):
    """The window strategy of a policy and its water levels."""

    strategy: WindowStrategy = WindowStrategy.SUMMARY
    levels: WaterLevels = Field(default_factory=WaterLevels)
    # Low-value share of a window (old tool outputs) above which it closes early, from YELLOW on.
    max_low_value_share: _Share = 0.70
    # How the forecast of the coming steps is computed: reported, and a rollover trigger.
    forecast: ForecastPolicy = Field(default_factory=ForecastPolicy)


class WindowHandoff(WireModel):
    """What a closing window hands the next one: ids and paths, not history.

    Values are not copied: the next window reads them from the state projection, so a fact that
    changes after the rollover is never shown at its handoff-time value.
    """

    schema_version: SchemaVersion = 1
    handoff_id: str
    thread_id: str
    # The run is the task (a run is one question).
    task_id: str
    previous_window: Annotated[int, Field(ge=1)]
    new_window: Annotated[int, Field(ge=2)]
    trigger: RolloverTrigger
    # The sum of the state's aggregate versions: every committed write moves it.
    state_version: Annotated[int, Field(ge=0)]
    state_hash: str
    # Session seq of the last record of the closed window: the next one shows only what follows.
    last_event_seq: Annotated[int, Field(ge=0)]
    active_goal_ids: tuple[str, ...] = ()
    active_constraints: tuple[str, ...] = ()
    active_operations: tuple[str, ...] = ()
    unresolved_questions: tuple[str, ...] = ()
    required_state_paths: tuple[str, ...] = ()
    required_evidence_ids: tuple[str, ...] = ()
    recent_receipt_ids: tuple[str, ...] = ()
    checkpoint_id: str
    # What the state projection does not hold but the work needs (a trace with no catalog has no
    # state at all): the files modified in this and every earlier window, newest last, and the
    # telling line of the task's newest failed outcome.
    files_modified: tuple[str, ...] = ()
    last_failure: str | None = None


class RolloverReport(WireModel):
    """The prepare that closed a window says so: why, how large the handoff is, how long it took."""

    trigger: RolloverTrigger
    previous_window: Annotated[int, Field(ge=1)]
    handoff_tokens: Annotated[int, Field(ge=0)]
    # Deciding, building the handoff and committing it, before the new window's context is assembled.
    rollover_ms: Annotated[int, Field(ge=0)]
