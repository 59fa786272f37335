"""Forecast of the coming steps' need. Pure and deterministic.

A *step* is one model call of the thread: an ``action`` assistant message. A step's growth is
what it added to the thread before the next step began — the message itself, its tool outcomes and
whatever else was recorded until the next action message. Only closed steps (followed by another
action message) count: the newest step is still growing. Growth is read from the token counts the
recorder stored with each record, so a forecast needs the view only, never another query.

``forecast = percentile(growth of the last N closed steps) × expected steps + declared items``, the
percentile by nearest rank (no interpolation: the same records give the same integer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from contracts.forecasts import Forecast, ForecastDeclaration, ForecastPolicy

from services.core.records import LedgerRecord, ascending_by_seq
from services.core.tokens import EncodingName
from services.core.turns import counts_as_step

__all__ = ["forecast_need", "nearest_rank", "step_growths"]


def step_growths(
    records: Sequence[LedgerRecord],
    *,
    own_thread: str = "",
    encoding: EncodingName = "o200k_base",
    last: int | None = None,
) -> tuple[int, ...]:
    """Tokens each closed step of ``own_thread`` added, oldest first (all records when it is ``""``);
    with ``last``, only the newest ``last`` of them.

    Records another thread wrote (inherited history, a parent's export) are no step of this one. Read
    from the newest record back, so a forecast of the last few steps costs what those steps hold, not
    the thread: walking every record of a 5,000-record thread takes 7 ms of each prepare.
    """
    ordered = records if ascending_by_seq(records) else sorted(records, key=lambda r: r.seq)
    newest_first: list[int] = []
    after = 0  # tokens recorded after the position reached, up to the next step
    closed = False  # a newer step was seen: the step reached now is closed
    for record in reversed(ordered):
        if own_thread and record.thread_id and record.thread_id != own_thread:
            continue
        after += record.tokens.get(encoding)
        if counts_as_step(record.body):
            if closed:
                newest_first.append(after)
                if last is not None and len(newest_first) >= last:
                    break
            closed = True
            after = 0
    return tuple(reversed(newest_first))


def nearest_rank(values: Sequence[int], percentile: int) -> int:
    """The ``percentile``-th value by nearest rank (1–100); 0 for no values."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, math.ceil(percentile / 100 * len(ordered)))
    return ordered[rank - 1]


def forecast_need(
    growths: Sequence[int],
    policy: ForecastPolicy,
    declared: ForecastDeclaration | None,
    *,
    safe_remaining: int,
) -> Forecast:
    """What the coming steps are expected to add, and whether ``safe_remaining`` holds it."""
    recent = tuple(growths[-policy.recent_steps :])
    step_growth = nearest_rank(recent, policy.percentile) if recent else policy.default_step_tokens
    declaration = declared or ForecastDeclaration()
    steps = declaration.expected_steps or policy.expected_steps
    items = (
        declaration.tool_calls * policy.tool_call_tokens
        + declaration.files * policy.file_tokens
        + declaration.evidence * policy.evidence_tokens
    )
    tokens = step_growth * steps + items
    return Forecast(
        tokens=tokens,
        step_growth=step_growth,
        steps=steps,
        observed_steps=len(recent),
        declared=items,
        fits=tokens <= safe_remaining,
    )
