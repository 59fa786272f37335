"""Assembly with a window policy: the reply reports its water level and forecast, and a rollover
window at YELLOW trims optional material back under the yellow line."""

from __future__ import annotations

from contracts import PreparedContext, PrepareRequest
from contracts.forecasts import ForecastDeclaration
from contracts.windows import WaterLevel, WindowPolicy, WindowStrategy
from services.core.assemble import ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from services.core.records import LedgerRecord
from services.core.tokens import counter_for
from tests.fixtures.builders import Thread, ledger_records

_ROLLOVER = WindowPolicy(strategy=WindowStrategy.ROLLOVER)


def _prepare(
    t: Thread, records: list[LedgerRecord], budget: int, window: WindowPolicy | None, **request: object
) -> PreparedContext:
    req = PrepareRequest.model_validate(
        {
            "session_id": t.session_id,
            "run_id": t.run_id,
            "instance_id": t.instance_id,
            "budget_tokens": budget,
        }
        | request
    )
    snapshot = ThreadSnapshot(
        t.session_id, t.run_id, t.instance_id, len(records), records[-1].seq, records[-1].event_key, records
    )
    return assemble_context(
        snapshot, req, resolve_budget(req), counter_for("o200k_base"), window_policy=window
    )


def _with_material(t: Thread) -> list[LedgerRecord]:
    events = [t.system("Sys."), t.user("fix the parser")]
    events += [t.resource("doc:style", "style guide line\n" * 200)]
    events += [t.assistant(calls=(("c1", "bash", {"cmd": "cat a.py"}),)), t.outcome("c1", "print(1)\n")]
    events += [t.assistant("done?"), t.user("go on")]
    return ledger_records(events)


def test_assemble_without_window_policy_reports_no_window() -> None:
    t = Thread()
    assert _prepare(t, _with_material(t), 100_000, None).window_report is None


def test_assemble_reports_level_safe_remaining_and_forecast() -> None:
    t = Thread()
    records = _with_material(t)
    prepared = _prepare(t, records, 100_000, WindowPolicy(), forecast={"tool_calls": 2})
    window = prepared.window_report
    assert window is not None
    used = prepared.budget_report.used.total
    assert (window.level, window.used, window.input_budget, window.safe_remaining) == (
        WaterLevel.GREEN,
        used,
        100_000,
        90_000 - used,
    )
    # one closed step (assistant c1 + its outcome); p90 of one value is that value
    assert window.forecast.observed_steps == 1
    assert window.forecast.declared == 2 * 800
    assert window.forecast.tokens == window.forecast.step_growth * 3 + 1600
    assert window.forecast.fits and not window.trimmed


def test_assemble_summary_window_at_yellow_keeps_its_material() -> None:
    t = Thread()
    records = _with_material(t)
    full = _prepare(t, records, 100_000, None).budget_report.used.total
    budget = int(full / 0.7)  # the whole view is 70 % of the budget: YELLOW
    prepared = _prepare(t, records, budget, WindowPolicy())
    assert prepared.window_report is not None and prepared.window_report.level is WaterLevel.YELLOW
    assert not prepared.window_report.trimmed and not prepared.omitted


def test_assemble_rollover_window_at_yellow_drops_optional_material_to_get_green() -> None:
    t = Thread()
    records = _with_material(t)
    full = _prepare(t, records, 100_000, None).budget_report.used.total
    budget = int(full / 0.7)
    prepared = _prepare(t, records, budget, _ROLLOVER)
    window = prepared.window_report
    assert window is not None
    assert (window.level, window.trimmed) == (WaterLevel.GREEN, True)
    assert [o.block_id for o in prepared.omitted] == ["material:3"]
    assert prepared.budget_report.reductions.dropped_material == 1
    # the same records without the window policy fit the budget whole: the drop is the level's doing
    assert not _prepare(t, records, budget, None).omitted


def test_assemble_rollover_window_in_green_is_the_same_context_as_without_policy() -> None:
    t = Thread()
    records = _with_material(t)
    with_policy = _prepare(t, records, 100_000, _ROLLOVER)
    without = _prepare(t, records, 100_000, None)
    assert with_policy.model_copy(update={"window_report": None}) == without


def test_assemble_forecast_declaration_counts_expected_steps() -> None:
    t = Thread()
    records = _with_material(t)
    declared = ForecastDeclaration(expected_steps=10).model_dump()
    prepared = _prepare(t, records, 100_000, WindowPolicy(), forecast=declared)
    assert prepared.window_report is not None and prepared.window_report.forecast.steps == 10
