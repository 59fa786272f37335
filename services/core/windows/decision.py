"""Whether a window goes on, trims, prepares its handoff or rolls over. Pure.

The model or runtime may propose a forecast or a phase change; this function decides, from numbers
the fleet measured. Rules, in order (the first that applies wins):

1. RED (used >= the red line): ``ROLLOVER`` on ``hard_limit`` at a safe boundary; not at one, the
   window cannot close yet: ``PREPARE_ROLLOVER`` naming what blocks it.
2. Not at a safe boundary (an open tool group, a critical operation in flight): never close a
   window there (§33) — ``TRIM`` from YELLOW on, else ``CONTINUE``.
3. Proactive triggers at a safe boundary, each ``ROLLOVER``: ``forecast`` (the safe remaining room
   cannot hold the forecast need), ``phase_boundary`` (any level: a new phase needs another
   composition, §34), ``recovery_boundary`` and ``semantic_density`` (from YELLOW on: below it there
   is too little history for a clean window to pay for itself).
4. ORANGE: ``PREPARE_ROLLOVER`` (build the handoff candidate); so is a forecast that fits but needs
   more than half the safe remaining room.
5. YELLOW: ``TRIM``. GREEN: ``CONTINUE``.

§36's sketch tests ``remaining < need * 0.5`` after ``remaining < need``, which can never hold;
rule 4 keeps the intent (warn before the forecast stops fitting) with a reachable condition.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from contracts.windows import RolloverTrigger, WaterLevel, WaterLevels

__all__ = ["WindowAction", "WindowDecision", "WindowSignals", "decide_window"]

_PRESSURE = (WaterLevel.YELLOW, WaterLevel.ORANGE, WaterLevel.RED)


class WindowAction(StrEnum):
    CONTINUE = "continue"
    TRIM = "trim"
    PREPARE_ROLLOVER = "prepare_rollover"
    ROLLOVER = "rollover"


@dataclass(frozen=True, slots=True)
class WindowSignals:
    """What the decision looks at, all measured or validated by the fleet."""

    # Tokens the window's next context holds, and the input budget they are a share of.
    used: int
    budget: int
    # Tokens the next steps are expected to need (0: no forecast).
    forecast_need: int = 0
    # A phase change was recorded since the window opened.
    phase_boundary: bool = False
    # An operation whose interruption would be unsafe is running (beyond an open tool group).
    critical_operation: bool = False
    # A tool call of the window still waits for its result: the group cannot be split.
    open_tool_group: bool = False
    # A stable checkpoint was reached since the window opened.
    recovery_boundary: bool = False
    # Share of the window's tokens that is low-value material, in [0, 1].
    low_value_share: float = 0.0


@dataclass(frozen=True, slots=True)
class WindowDecision:
    """The action, the trigger that fired (for a rollover or its preparation) and why."""

    action: WindowAction
    level: WaterLevel
    safe_remaining: int
    trigger: RolloverTrigger | None = None
    # What keeps a window that should close from closing now.
    blocked_by: str | None = None


def decide_window(signals: WindowSignals, levels: WaterLevels, max_low_value_share: float) -> WindowDecision:
    """The decision of the module docstring's rules for ``signals`` under ``levels``."""
    level = levels.level_of(signals.used, signals.budget)
    remaining = levels.safe_remaining(signals.used, signals.budget)
    blocked = _blocked_by(signals)

    def decided(action: WindowAction, trigger: RolloverTrigger | None = None) -> WindowDecision:
        return WindowDecision(action, level, remaining, trigger, blocked)

    if level is WaterLevel.RED:
        if blocked is not None:
            return decided(WindowAction.PREPARE_ROLLOVER, RolloverTrigger.HARD_LIMIT)
        return decided(WindowAction.ROLLOVER, RolloverTrigger.HARD_LIMIT)
    if blocked is not None:
        return decided(WindowAction.TRIM if level in _PRESSURE else WindowAction.CONTINUE)
    trigger = _proactive(signals, level, remaining, max_low_value_share)
    if trigger is not None:
        return decided(WindowAction.ROLLOVER, trigger)
    if signals.forecast_need > 0 and remaining < 2 * signals.forecast_need:
        return decided(WindowAction.PREPARE_ROLLOVER, RolloverTrigger.FORECAST)
    if level is WaterLevel.ORANGE:
        return decided(WindowAction.PREPARE_ROLLOVER)
    if level is WaterLevel.YELLOW:
        return decided(WindowAction.TRIM)
    return decided(WindowAction.CONTINUE)


def _blocked_by(signals: WindowSignals) -> str | None:
    if signals.open_tool_group:
        return "open_tool_group"
    if signals.critical_operation:
        return "critical_operation"
    return None


def _proactive(
    signals: WindowSignals, level: WaterLevel, remaining: int, max_low_value_share: float
) -> RolloverTrigger | None:
    # The forecast, recovery and density triggers wait for YELLOW: below it a clean window frees
    # little, and a window whose fixed part (instructions, task, state) alone leaves less room than
    # the forecast would otherwise roll over on every prepare.
    pressure = level in _PRESSURE
    if pressure and signals.forecast_need > 0 and remaining < signals.forecast_need:
        return RolloverTrigger.FORECAST
    if signals.phase_boundary:
        return RolloverTrigger.PHASE_BOUNDARY
    if not pressure:
        return None
    if signals.recovery_boundary:
        return RolloverTrigger.RECOVERY_BOUNDARY
    if signals.low_value_share > max_low_value_share:
        return RolloverTrigger.SEMANTIC_DENSITY
    return None
