"""Water levels at their thresholds, per-step growth and the forecast: pure table tests."""

from __future__ import annotations

from contracts import EventKind

import pytest
from pydantic import ValidationError

from contracts.forecasts import ForecastDeclaration, ForecastPolicy
from contracts.windows import WaterLevel, WaterLevels, WindowPolicy
from services.core.forecast import forecast_need, nearest_rank, step_growths
from services.core.water_levels import green_room, window_report
from services.core.records import LedgerRecord, TokenCounts


def _rec(
    seq: int, kind: EventKind, tokens: int, *, purpose: str = "action", thread: str = ""
) -> LedgerRecord:
    payload: dict[str, object] = {"text": "x"}
    if kind is EventKind.ASSISTANT_MESSAGE:
        payload = {"text": "x", "tool_calls": [], "purpose": purpose}
    if kind is EventKind.TOOL_OUTCOME:
        payload = {"call_id": "c", "status": "success", "text": "x"}
    return LedgerRecord(
        seq=seq,
        event_key=f"k{seq}",
        kind=kind,
        payload=payload,  # type: ignore[arg-type]
        text="x",
        tokens=TokenCounts(tokens, tokens),
        thread_id=thread,
    )


A, T, U = EventKind.ASSISTANT_MESSAGE, EventKind.TOOL_OUTCOME, EventKind.USER_INPUT


@pytest.mark.parametrize(
    ("used", "budget", "level"),
    [
        (5999, 10_000, WaterLevel.GREEN),  # 59.99 %
        (6000, 10_000, WaterLevel.YELLOW),  # 60 % exactly
        (7499, 10_000, WaterLevel.YELLOW),
        (7500, 10_000, WaterLevel.ORANGE),
        (8999, 10_000, WaterLevel.ORANGE),
        (9000, 10_000, WaterLevel.RED),
        (12_000, 10_000, WaterLevel.RED),
        (0, 0, WaterLevel.RED),  # no budget at all is never green
    ],
)
def test_window_report_level_starts_exactly_at_its_threshold(
    used: int, budget: int, level: WaterLevel
) -> None:
    report = window_report(used, budget, WindowPolicy(), (), None)
    assert report.level is level
    assert report.safe_remaining == max(0, int(budget * 0.9) - used)


def test_green_room_is_the_largest_count_that_stays_green() -> None:
    policy = WindowPolicy()
    room = green_room(10_000, policy)
    assert room == 5999
    assert policy.levels.level_of(room, 10_000) is WaterLevel.GREEN
    assert policy.levels.level_of(room + 1, 10_000) is WaterLevel.YELLOW
    odd = green_room(333, policy)  # 0.6 × 333 = 199.8: 199 is green, 200 is yellow
    assert (policy.levels.level_of(odd, 333), policy.levels.level_of(odd + 1, 333)) == (
        WaterLevel.GREEN,
        WaterLevel.YELLOW,
    )


def test_water_levels_refuse_thresholds_out_of_order() -> None:
    with pytest.raises(ValidationError):
        WaterLevels(yellow=0.8, orange=0.75, red=0.9)


@pytest.mark.parametrize(
    ("records", "growths"),
    [
        ([], ()),
        ([_rec(1, U, 50)], ()),  # no step yet
        ([_rec(1, U, 50), _rec(2, A, 10), _rec(3, T, 100)], ()),  # the only step is still open
        # step 1 = assistant 10 + outcome 100 + user 5; step 2 open
        ([_rec(1, U, 50), _rec(2, A, 10), _rec(3, T, 100), _rec(4, U, 5), _rec(5, A, 20)], (115,)),
        ([_rec(1, A, 10), _rec(2, A, 20), _rec(3, T, 7), _rec(4, A, 1)], (10, 27)),
        # a completion check's answer is no model step: it grows the step it falls in
        ([_rec(1, A, 10), _rec(2, A, 4, purpose="completion"), _rec(3, A, 1)], (14,)),
    ],
)
def test_step_growths_count_closed_action_steps_only(
    records: list[LedgerRecord], growths: tuple[int, ...]
) -> None:
    assert step_growths(records) == growths


def test_step_growths_of_the_last_steps_are_the_tail_of_all_of_them_in_any_record_order() -> None:
    kinds = [U, A, T, T, A, U, A, T, A, A, T, U, A, T, T, A]
    records = [_rec(n + 1, kind, 3 * n + 1) for n, kind in enumerate(kinds)]
    everything = step_growths(records)
    assert len(everything) == 6
    for last in range(1, 9):
        assert step_growths(records, last=last) == everything[-last:]
    assert step_growths(list(reversed(records))) == everything
    assert step_growths(list(reversed(records)), last=2) == everything[-2:]


def test_step_growths_ignore_records_of_other_threads() -> None:
    records = [_rec(1, A, 10, thread="r.a"), _rec(2, T, 500, thread="r.parent"), _rec(3, A, 1, thread="r.a")]
    assert step_growths(records, own_thread="r.a") == (10,)


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ((), 90, 0),
        ((7,), 90, 7),
        ((1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 90, 9),
        ((10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 90, 9),  # order of the input does not matter
        ((1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 100, 10),
        ((1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 1, 1),
        ((5, 100), 50, 5),
    ],
)
def test_nearest_rank_picks_the_value_at_the_rank(values: tuple[int, ...], p: int, expected: int) -> None:
    assert nearest_rank(values, p) == expected


_POLICY = ForecastPolicy(
    recent_steps=4,
    percentile=90,
    expected_steps=3,
    default_step_tokens=1000,
    tool_call_tokens=800,
    file_tokens=2000,
    evidence_tokens=600,
)


@pytest.mark.parametrize(
    ("growths", "declared", "safe", "tokens", "step_growth", "steps", "observed", "items", "fits"),
    [
        # no closed steps: the policy default × the policy's steps
        ((), None, 10_000, 3000, 1000, 3, 0, 0, True),
        # only the last 4 steps count (the 5000 is older); p90 of (10, 20, 30, 40) = 40
        ((5000, 10, 20, 30, 40), None, 10_000, 120, 40, 3, 4, 0, True),
        # the declaration: 2 steps, 3 tool calls, 1 file, 2 evidence = 2400 + 2000 + 1200
        (
            (100,),
            ForecastDeclaration(expected_steps=2, tool_calls=3, files=1, evidence=2),
            10_000,
            5800,
            100,
            2,
            1,
            5600,
            True,
        ),
        # fits is ``<=`` the safe remaining
        ((100,), None, 300, 300, 100, 3, 1, 0, True),
        ((100,), None, 299, 300, 100, 3, 1, 0, False),
    ],
)
def test_forecast_need_is_growth_percentile_times_steps_plus_declared_items(
    growths: tuple[int, ...],
    declared: ForecastDeclaration | None,
    safe: int,
    tokens: int,
    step_growth: int,
    steps: int,
    observed: int,
    items: int,
    fits: bool,
) -> None:
    f = forecast_need(growths, _POLICY, declared, safe_remaining=safe)
    assert (f.tokens, f.step_growth, f.steps, f.observed_steps, f.declared, f.fits) == (
        tokens,
        step_growth,
        steps,
        observed,
        items,
        fits,
    )


def test_forecast_declaration_is_bounded() -> None:
    with pytest.raises(ValidationError):
        ForecastDeclaration(tool_calls=1001)
    with pytest.raises(ValidationError):
        ForecastPolicy(percentile=0)


def test_window_report_forecast_fits_against_the_red_line() -> None:
    # 5000 of 10 000 used: 4000 left to the red line; 3 steps of 1500 (the default) do not fit
    report = window_report(5000, 10_000, WindowPolicy(), (), None)
    assert (report.level, report.safe_remaining, report.forecast.tokens, report.forecast.fits) == (
        WaterLevel.GREEN,
        4000,
        4500,
        False,
    )
