"""Water levels of a prepared context. Pure.

The level is the context's own size (``budget_report.used.total``, tool schemas included) as a
share of the prepare's input budget, at the policy's thresholds (``WaterLevels.level_of``: each level
starts at its threshold). YELLOW and above trim low-value optional material back toward the yellow
line — :func:`green_room` is the size that stays green.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from contracts.forecasts import ForecastDeclaration
from contracts.prepare import WindowReport
from contracts.windows import WindowPolicy

from services.core.forecast import forecast_need

__all__ = ["green_room", "window_report"]


def green_room(input_budget: int, policy: WindowPolicy) -> int:
    """The most tokens a context may use and still be GREEN."""
    # level_of compares used / budget >= yellow: the largest green count is just below that product.
    return max(0, math.ceil(input_budget * policy.levels.yellow) - 1)


def window_report(
    used: int,
    input_budget: int,
    policy: WindowPolicy,
    growths: Sequence[int],
    declared: ForecastDeclaration | None,
    *,
    trimmed: bool = False,
) -> WindowReport:
    """The level, safe remaining tokens and forecast of a context that uses ``used`` tokens."""
    safe = policy.levels.safe_remaining(used, input_budget)
    return WindowReport(
        level=policy.levels.level_of(used, input_budget),
        used=used,
        input_budget=input_budget,
        safe_remaining=safe,
        forecast=forecast_need(growths, policy.forecast, declared, safe_remaining=safe),
        trimmed=trimmed,
    )
