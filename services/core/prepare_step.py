"""What a prepare does next, from what it knows so far. Pure.

The assembler's shell (``services/app/preparing.py``) runs one loop: it asks ``next_step`` what to
do, does it — assembles the view, rolls the window over, waits for a compaction, learns from the
runtime's usage report — records what came of it in the ``PrepareProgress`` and asks again, until
the step is ``Done`` (or ``Refuse``). Assembly happens only where a step says ``Assemble``, at the
depth it names: a view over budget at one depth is assembled one deeper (its committed summary)
before the prepare asks for a compaction.

The order, from the first step: a rollover window is measured by its assembly and closed when the
decision says so (the next window is assembled instead); a context that does not fit asks for the
thread's compaction and waits for it, then is assembled again on the compacted view, or, once no
compaction lands in time, without the oldest history still awaiting it; a context that fits first
time teaches the calibration (profiles that learn from usage), and is counted again when the new
factor counts more. A prepare after a provider overflow is served from one assembly under its
raised calibration, and asks for a compaction that makes room for the next steps without waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from contracts import PreparedContext
from contracts.windows import RolloverReport, RolloverTrigger

from services.core.assemble import OverBudgetView
from services.core.calibration import Calibration
from services.core.windows.decision import WindowAction, WindowDecision

__all__ = [
    "HARD_BUDGET",
    "PROVIDER_OVERFLOW",
    "Assemble",
    "AwaitCompaction",
    "CompactionWait",
    "Done",
    "Learn",
    "PrepareProgress",
    "PrepareStep",
    "Recount",
    "Refuse",
    "RequestCompaction",
    "RollOver",
    "next_step",
]

# Why a prepare asks for its thread's compaction (in the job, for the compactor's logs).
HARD_BUDGET = ("hard_budget",)
PROVIDER_OVERFLOW = ("provider_overflow",)


@dataclass(frozen=True, slots=True)
class Assemble:
    """Assemble the current view under the current budget.

    ``measure_window``: the assembly also measures the window, which is then decided from it.
    ``depth``: how deep into its summaries the history is shown (``services/core/history_depth.py``).
    """

    depth: int = 0
    compaction_wait_ms: int = 0
    allow_drop_history: bool = False
    measure_window: bool = False


@dataclass(frozen=True, slots=True)
class RollOver:
    """Close the current window as the decision says, and serve from the next one."""

    trigger: RolloverTrigger


@dataclass(frozen=True, slots=True)
class AwaitCompaction:
    """Ask for the thread's urgent compaction, leaving ``reserved_tokens`` for what is not the view,
    and wait until its commit lands or waiting cannot help any more."""

    reserved_tokens: int
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RequestCompaction:
    """Ask for the thread's urgent compaction without waiting for it."""

    reserved_tokens: int
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Learn:
    """Learn the profile's calibration from the request's usage report, given this context."""

    prepared: PreparedContext


@dataclass(frozen=True, slots=True)
class Recount:
    """Calibrate the budget with ``calibration`` and assemble again."""

    calibration: Calibration


@dataclass(frozen=True, slots=True)
class Done:
    prepared: PreparedContext


@dataclass(frozen=True, slots=True)
class Refuse:
    """Even without the history awaiting compaction the view does not fit: the prepare fails."""

    over: OverBudgetView


PrepareStep = Assemble | RollOver | AwaitCompaction | RequestCompaction | Learn | Recount | Done | Refuse


@dataclass(frozen=True, slots=True)
class CompactionWait:
    """How waiting for a compaction went: how long, and whether a new view revision landed in time."""

    waited_ms: int
    landed: bool


@dataclass(frozen=True, slots=True)
class PrepareProgress:
    # The calibration the budget is counted with now.
    calibration: Calibration
    # The view's window rolls over: this prepare decides, from its first assembly, whether it closes.
    rollover_window: bool = False
    # A provider refused the previous context as too long: the calibration is raised already.
    after_overflow: bool = False
    # The window decision, once measured; the rollover report, once this prepare closed the window.
    decision: WindowDecision | None = None
    rolled: bool = False
    report: RolloverReport | None = None
    # How deep into its summaries the last assembly showed the history, and how deep the view goes:
    # over budget at one depth, the prepare goes one deeper before it asks for a compaction.
    depth: int = 0
    depths: int = 1
    # The last assembly's outcome; None before it and after the view or budget changed.
    outcome: PreparedContext | OverBudgetView | None = None
    # What usage taught the calibration (learned once per prepare).
    learned: Calibration | None = None
    # The last wait for a compaction, once one began.
    waited: CompactionWait | None = None
    # The compaction a fitting context after an overflow asks for has been asked for.
    requested: bool = False


def next_step(p: PrepareProgress) -> PrepareStep:
    if p.rollover_window and p.decision is None:
        return Assemble(p.depth, measure_window=True)
    decision = p.decision
    if decision is not None and decision.action is WindowAction.ROLLOVER and not p.rolled:
        if decision.trigger is not None:
            return RollOver(decision.trigger)
    reasons = PROVIDER_OVERFLOW if p.after_overflow else HARD_BUDGET
    match p.outcome:
        case None:
            if p.waited is None:
                return Assemble(p.depth)
            # What waited for a compaction did not fit at any shallower depth.
            return Assemble(
                p.depths - 1, compaction_wait_ms=p.waited.waited_ms, allow_drop_history=not p.waited.landed
            )
        case OverBudgetView() as over:
            if p.waited is None and p.depth + 1 < p.depths:
                return Assemble(p.depth + 1)
            if p.waited is not None and not p.waited.landed:
                return Refuse(over)
            return AwaitCompaction(over.reserved_tokens, reasons)
        case PreparedContext() as prepared:
            if p.waited is not None:
                return Done(prepared)  # served after a compaction wait: as assembled
            if p.after_overflow:
                if not p.requested:
                    return RequestCompaction(prepared.budget_report.used.tool_schemas, reasons)
                return Done(prepared)
            if p.learned is None:
                return Learn(prepared)
            if p.learned.factor > p.calibration.factor:
                return Recount(p.learned)
            if p.report is not None:
                return Done(prepared.model_copy(update={"rollover": p.report}))
            return Done(prepared)
        case _:
            assert_never(p.outcome)
