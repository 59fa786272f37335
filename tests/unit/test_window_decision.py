"""The window decision, table-tested: each row one situation, the action and trigger."""

from __future__ import annotations

import pytest

from contracts.windows import RolloverTrigger as T
from contracts.windows import WaterLevel, WaterLevels
from services.core.windows.decision import WindowAction as A
from services.core.windows.decision import WindowSignals, decide_window

# Budget 1,000 with the default levels: yellow at 600, orange at 750, red at 900 tokens.
BUDGET = 1_000
LEVELS = WaterLevels()
DENSITY = 0.70

# (case, signals, expected action, expected trigger, expected blocker)
TABLE = [
    ("green continues", dict(used=100), A.CONTINUE, None, None),
    ("one token below yellow continues", dict(used=599), A.CONTINUE, None, None),
    ("yellow trims", dict(used=600), A.TRIM, None, None),
    ("orange prepares the handoff", dict(used=750), A.PREPARE_ROLLOVER, None, None),
    ("red rolls over on the hard limit", dict(used=900), A.ROLLOVER, T.HARD_LIMIT, None),
    ("over the budget rolls over too", dict(used=1_400), A.ROLLOVER, T.HARD_LIMIT, None),
    (
        "red with an open tool group cannot close yet",
        dict(used=950, open_tool_group=True),
        A.PREPARE_ROLLOVER,
        T.HARD_LIMIT,
        "open_tool_group",
    ),
    (
        "red with a critical operation cannot close yet",
        dict(used=950, critical_operation=True),
        A.PREPARE_ROLLOVER,
        T.HARD_LIMIT,
        "critical_operation",
    ),
    (
        "forecast that no longer fits rolls over early",
        dict(used=650, forecast_need=300),
        A.ROLLOVER,
        T.FORECAST,
        None,
    ),
    (
        "forecast that no longer fits a green window only prepares",
        dict(used=500, forecast_need=450),
        A.PREPARE_ROLLOVER,
        T.FORECAST,
        None,
    ),
    (
        "forecast that fits but takes over half the room prepares",
        dict(used=500, forecast_need=250),
        A.PREPARE_ROLLOVER,
        T.FORECAST,
        None,
    ),
    ("forecast well within the room continues", dict(used=100, forecast_need=50), A.CONTINUE, None, None),
    (
        "phase boundary rolls over even when green",
        dict(used=100, phase_boundary=True),
        A.ROLLOVER,
        T.PHASE_BOUNDARY,
        None,
    ),
    (
        "phase boundary inside an open tool group waits",
        dict(used=100, phase_boundary=True, open_tool_group=True),
        A.CONTINUE,
        None,
        "open_tool_group",
    ),
    (
        "critical operation at yellow only trims",
        dict(used=700, critical_operation=True, forecast_need=800),
        A.TRIM,
        None,
        "critical_operation",
    ),
    (
        "recovery boundary at yellow rolls over",
        dict(used=600, recovery_boundary=True),
        A.ROLLOVER,
        T.RECOVERY_BOUNDARY,
        None,
    ),
    (
        "recovery boundary at green is not worth a window",
        dict(used=300, recovery_boundary=True),
        A.CONTINUE,
        None,
        None,
    ),
    (
        "low-value share above the threshold at yellow rolls over",
        dict(used=650, low_value_share=0.71),
        A.ROLLOVER,
        T.SEMANTIC_DENSITY,
        None,
    ),
    ("low-value share at the threshold only trims", dict(used=650, low_value_share=0.70), A.TRIM, None, None),
    ("low-value share at green continues", dict(used=200, low_value_share=0.95), A.CONTINUE, None, None),
    (
        "forecast wins over phase when both fire",
        dict(used=800, forecast_need=200, phase_boundary=True),
        A.ROLLOVER,
        T.FORECAST,
        None,
    ),
]


@pytest.mark.parametrize(
    ("case", "signals", "action", "trigger", "blocked"), TABLE, ids=[row[0] for row in TABLE]
)
def test_decide_window_follows_the_decision_table(
    case: str, signals: dict[str, object], action: A, trigger: T | None, blocked: str | None
) -> None:
    decision = decide_window(WindowSignals(budget=BUDGET, **signals), LEVELS, DENSITY)  # type: ignore[arg-type]
    assert (decision.action, decision.trigger, decision.blocked_by) == (action, trigger, blocked), case


def test_decide_window_reports_level_and_safe_remaining_below_the_red_line() -> None:
    decision = decide_window(WindowSignals(used=760, budget=BUDGET), LEVELS, DENSITY)
    assert (decision.level, decision.safe_remaining) == (WaterLevel.ORANGE, 140)


def test_decide_window_treats_an_empty_budget_as_red() -> None:
    assert decide_window(WindowSignals(used=0, budget=0), LEVELS, DENSITY).action is A.ROLLOVER
