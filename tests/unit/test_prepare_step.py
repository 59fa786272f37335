"""The prepare loop's pure step: what a prepare does next, walked through the loop's paths."""

from __future__ import annotations

from dataclasses import replace

from contracts import PreparedContext, PrepareRequest
from contracts.windows import RolloverReport, RolloverTrigger, WaterLevel
from services.core.assemble import OverBudgetView, ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from services.core.calibration import Calibration
from services.core.prepare_step import (
    HARD_BUDGET,
    PROVIDER_OVERFLOW,
    Assemble,
    AwaitCompaction,
    CompactionWait,
    Done,
    Learn,
    PrepareProgress,
    Recount,
    Refuse,
    RequestCompaction,
    RollOver,
    next_step,
)
from services.core.tokens import counter_for
from services.core.windows.decision import WindowAction, WindowDecision

from tests.fixtures.builders import Thread, ledger_records

_OVER = OverBudgetView(
    900,
    500,
    (
        {"block_id": "group:3", "kind": "interaction", "tokens": 700},
        {"block_id": "tool_schemas", "kind": "tool_schemas", "tokens": 42},
    ),
    ("masked:group:3",),
)
_REPORT = RolloverReport(
    trigger=RolloverTrigger.HARD_LIMIT, previous_window=1, handoff_tokens=120, rollover_ms=3
)


def _prepared() -> PreparedContext:
    t = Thread()
    records = ledger_records([t.system("s"), t.user("q")])
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=8_000
    )
    snapshot = ThreadSnapshot(
        t.session_id, t.run_id, t.instance_id, len(records), records[-1].seq, records[-1].event_key, records
    )
    prepared = assemble_context(snapshot, request, resolve_budget(request), counter_for("o200k_base"))
    assert isinstance(prepared, PreparedContext)
    return prepared


def _decision(action: WindowAction, trigger: RolloverTrigger | None = None) -> WindowDecision:
    return WindowDecision(action, WaterLevel.RED, 0, trigger)


def test_a_context_that_fits_first_time_teaches_the_calibration_and_is_served() -> None:
    prepared = _prepared()
    p = PrepareProgress(Calibration())
    assert next_step(p) == Assemble()
    p = replace(p, outcome=prepared)
    assert next_step(p) == Learn(prepared)
    assert next_step(replace(p, learned=Calibration())) == Done(prepared)


def test_a_calibration_that_counts_more_is_counted_again_once() -> None:
    prepared = _prepared()
    learned = Calibration(1.3, 1)
    p = PrepareProgress(Calibration(), outcome=prepared, learned=learned)
    assert next_step(p) == Recount(learned)
    p = replace(p, calibration=learned, outcome=None)
    assert next_step(p) == Assemble()
    assert next_step(replace(p, outcome=prepared)) == Done(prepared)


def test_a_view_over_budget_waits_for_compaction_then_drops_history_once_none_landed() -> None:
    p = PrepareProgress(Calibration(), outcome=_OVER)
    assert next_step(p) == AwaitCompaction(42, HARD_BUDGET)
    landed = replace(p, outcome=None, waited=CompactionWait(120, landed=True))
    assert next_step(landed) == Assemble(compaction_wait_ms=120)
    assert next_step(replace(landed, outcome=_OVER)) == AwaitCompaction(42, HARD_BUDGET)
    late = replace(p, outcome=None, waited=CompactionWait(5_000, landed=False))
    assert next_step(late) == Assemble(compaction_wait_ms=5_000, allow_drop_history=True)
    assert next_step(replace(late, outcome=_OVER)) == Refuse(_OVER)
    prepared = _prepared()
    assert next_step(replace(late, outcome=prepared)) == Done(prepared)  # as assembled: no learning


def test_a_rollover_window_is_measured_first_and_closed_when_the_decision_says_so() -> None:
    prepared = _prepared()
    p = PrepareProgress(Calibration(), rollover_window=True)
    assert next_step(p) == Assemble(measure_window=True)
    due = replace(p, outcome=prepared, decision=_decision(WindowAction.ROLLOVER, RolloverTrigger.HARD_LIMIT))
    assert next_step(due) == RollOver(RolloverTrigger.HARD_LIMIT)
    rolled = replace(due, rolled=True, report=_REPORT, outcome=None)
    assert next_step(rolled) == Assemble()
    served = replace(rolled, outcome=prepared, learned=Calibration())
    assert next_step(served) == Done(prepared.model_copy(update={"rollover": _REPORT}))


def test_a_window_that_stays_serves_its_measurement_and_one_that_did_not_fit_is_assembled_again() -> None:
    prepared = _prepared()
    stays = PrepareProgress(Calibration(), rollover_window=True, decision=_decision(WindowAction.CONTINUE))
    assert next_step(replace(stays, outcome=prepared)) == Learn(prepared)
    assert next_step(stays) == Assemble()  # its measurement refused: the assembly refuses the prepare


def test_after_a_provider_overflow_the_context_asks_for_a_compaction_without_waiting() -> None:
    prepared = _prepared()
    p = PrepareProgress(Calibration(1.2, 1), after_overflow=True)
    assert next_step(p) == Assemble()
    fits = replace(p, outcome=prepared)
    tools = prepared.budget_report.used.tool_schemas
    assert next_step(fits) == RequestCompaction(tools, PROVIDER_OVERFLOW)
    assert next_step(replace(fits, requested=True)) == Done(prepared)
    assert next_step(replace(p, outcome=_OVER)) == AwaitCompaction(42, PROVIDER_OVERFLOW)


def test_a_view_over_budget_at_one_depth_is_assembled_one_deeper_before_asking_for_compaction() -> None:
    p = PrepareProgress(Calibration(), depth=0, depths=2)
    assert next_step(p) == Assemble(0)
    assert next_step(replace(p, outcome=_OVER)) == Assemble(1)
    deepest = replace(p, depth=1, outcome=_OVER)
    assert next_step(deepest) == AwaitCompaction(42, HARD_BUDGET)
    # What waited for a compaction is assembled at the view's deepest: nothing shallower fitted.
    landed = replace(deepest, outcome=None, waited=CompactionWait(120, landed=True))
    assert next_step(landed) == Assemble(1, compaction_wait_ms=120)
    assert next_step(replace(landed, outcome=_OVER)) == AwaitCompaction(42, HARD_BUDGET)
