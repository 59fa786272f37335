"""The ladder's rollover rung: the window strategy, through the fleet's own window functions. Pure.

A thread under the rollover strategy is never summarized; at every prepare the rung measures the
window as the fleet's ``WindowKeeper`` does (one assembly), asks ``decide_window`` and, when it says
``ROLLOVER``, closes the window with ``roll_over`` — the handoff built from the state projection,
the next window's snapshot from ``next_window_snapshot`` — and serves that. Later prepares of the
window see only what was recorded after it opened, plus the handoff and the state.

Recovery is checked on each new window's first context: every path the handoff says the window
needs must be shown with the value it had before the rollover, marked CURRENT (a stateless trace
has nothing to check).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from contracts import PathRule
from contracts.windows import RolloverTrigger, WindowHandoff, WindowPolicy

from services.core.assemble import OverBudgetView, ThreadSnapshot, assemble_context
from services.core.state import StateView
from services.core.windows.decision import WindowAction, WindowSignals, decide_window
from services.core.windows.next_window import next_window_snapshot, roll_over
from services.core.windows.signals import low_value_share, open_calls, window_records
from contracts.exceptions import ContextBudgetExceeded, CtxError

from services.core.evaluation.ladder import LadderContext, LadderPoint
from services.core.evaluation.pollution import current_marker, text_of

__all__ = ["ROLLOVER_RUNG", "RolloverRung"]

ROLLOVER_RUNG = "rollover"


@dataclass
class RolloverRung:
    """One thread's windows under the rollover strategy, in the order of its prepares."""

    policy: WindowPolicy = field(default_factory=WindowPolicy)
    # The catalog's path rules: they say which facts are goals, constraints, open questions.
    rules: tuple[PathRule, ...] = ()
    window: int = 1
    opened_after: int = 0
    handoff: WindowHandoff | None = None

    @property
    def name(self) -> str:
        """How the report names the rung."""
        return ROLLOVER_RUNG

    def context(self, point: LadderPoint) -> LadderContext:
        """The context of the current window, or of the next one when this prepare closes it."""
        snapshot = self._snapshot(point)
        trigger = self._due(point, snapshot)
        handoff: WindowHandoff | None = None
        if trigger is not None:
            handoff, snapshot = roll_over(
                snapshot,
                window=self.window,
                opened_after=self.opened_after,
                state=_state(point),
                rules=self.rules,
                trigger=trigger,
            )
            self.window, self.opened_after, self.handoff = handoff.new_window, handoff.last_event_seq, handoff
        try:
            prepared = assemble_context(
                snapshot, point.request, point.budget, point.counter, allow_drop_history=True
            )
        except CtxError as exc:
            return self._refused(exc)
        if isinstance(prepared, OverBudgetView):
            return self._refused(prepared.error())
        recovered = None
        if handoff is not None:
            recovered = _shows_state(handoff, point, text_of(prepared.openai_messages()))
        return LadderContext(prepared, window=self.window, recovered=recovered)

    def _refused(self, exc: CtxError) -> LadderContext:
        return LadderContext(None, f"{exc.code.value}: {exc.message}", window=self.window)

    def _snapshot(self, point: LadderPoint) -> ThreadSnapshot:
        # The rollover strategy never summarizes: the window, the handoff and the state replace it.
        snapshot = replace(point.snapshot, summary=None, covered_to=0, view_revision=0)
        return next_window_snapshot(snapshot, self.handoff) if self.handoff is not None else snapshot

    def _due(self, point: LadderPoint, snapshot: ThreadSnapshot) -> RolloverTrigger | None:
        """What closes the window at this prepare, as the fleet's ``WindowKeeper`` decides it."""
        # Over the budget or not fitting at its smallest: past the red line.
        past_red = point.budget.input_budget + 1
        try:
            measured = assemble_context(snapshot, point.request, point.budget, point.counter)
        except ContextBudgetExceeded as over:
            measured = None
            used = max(int(str(over.details.get("required", 0))), past_red)
        if isinstance(measured, OverBudgetView):
            used = max(measured.total, past_red)
        elif measured is not None:
            used = measured.budget_report.used.total
        own = window_records(snapshot.records, self.opened_after, snapshot.own_thread)
        signals = WindowSignals(
            used=used,
            budget=point.budget.input_budget,
            open_tool_group=bool(open_calls(own)),
            low_value_share=low_value_share(own),
        )
        decision = decide_window(signals, self.policy.levels, self.policy.max_low_value_share)
        return decision.trigger if decision.action is WindowAction.ROLLOVER else None


def _state(point: LadderPoint) -> StateView:
    if point.state is not None:
        return point.state
    return StateView(facts={f.path: f for f in point.snapshot.facts})


def _shows_state(handoff: WindowHandoff, point: LadderPoint, text: str) -> bool | None:
    """Whether every path the handoff needs is shown CURRENT with the value it had before the rollover."""
    before = {f.path: f for f in point.snapshot.facts}
    needed = [before[p] for p in handoff.required_state_paths if p in before]
    if not needed:
        return None
    return all(
        any(line.startswith(current_marker(f.path, f.value)) for line in text.splitlines()) for f in needed
    )
