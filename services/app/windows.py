"""Rolling a thread's window over from state, in the prepare that finds it due.

Where it runs: in the prepare's loop (``services/core/prepare_step.py``). A rollover calls no
model — the handoff is built from the state projection the recorder already keeps — so it costs the
assembly that measures the window, one small transaction and one assembly of the new window, all
bounded and reported in the reply (``rollover.rollover_ms``). Sending it through the compactor would
add a job round trip and a wait to exactly the prepare that must not be served from the old window,
for no work a compactor is better placed to do. Concurrent prepares of one thread race on the view
revision: the loser gets ``RevisionConflict``, reloads and serves the window the winner opened.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import replace
from typing import assert_never

from contracts import PreparedContext
from contracts.windows import RolloverReport, RolloverTrigger, WindowHandoff

from services.core.assemble import OverBudgetView, ThreadSnapshot
from services.core.budget import BudgetSpec
from services.core.state import StateView
from services.core.tokens import counter_for
from services.core.windows.decision import WindowAction, WindowDecision, WindowSignals, decide_window
from services.core.windows.handoff import render_handoff
from services.core.windows.next_window import roll_over
from services.core.windows.signals import (
    low_value_share,
    open_calls,
    phase_boundary,
    recovery_boundary,
    window_records,
)
from contracts.exceptions import ContextBudgetExceeded, RevisionConflict
from services.store.ports import PrepareStore
from services.app.views import ThreadView, ViewLoader

__all__ = ["WindowKeeper"]

# Handoff candidates kept from ORANGE prepares, one per thread (bounded: a cache, not state).
_CANDIDATES = 1024


class WindowKeeper:
    """Decides each prepare's window and closes it when the decision says so."""

    def __init__(self, store: PrepareStore, loader: ViewLoader) -> None:
        self._store = store
        self._loader = loader
        # ORANGE builds the handoff ahead; RED commits it if the state has not moved since.
        self._candidates: OrderedDict[str, WindowHandoff] = OrderedDict()

    def decide(
        self,
        view: ThreadView,
        snapshot: ThreadSnapshot,
        measured: PreparedContext | OverBudgetView | ContextBudgetExceeded,
        budget: BudgetSpec,
    ) -> WindowDecision:
        """Whether this prepare closes the window, from its assembly of the current one (``measured``:
        the context, or what did not fit); an ORANGE window's handoff is built ahead."""
        match measured:
            case PreparedContext():
                used = measured.budget_report.used.total
                forecast = measured.window_report.forecast.tokens if measured.window_report else 0
            case OverBudgetView():
                used, forecast = max(measured.total, budget.input_budget + 1), 0
            case ContextBudgetExceeded():
                # Not even fitting at its smallest: past the red line.
                used = max(int(str(measured.details.get("required", 0))), budget.input_budget + 1)
                forecast = 0
            case _:
                assert_never(measured)
        opened_after = _opened_after(view)
        own = window_records(snapshot.records, opened_after, view.head.thread_id)
        # A critical operation has no source in the fleet yet: the decision takes it as an input.
        signals = WindowSignals(
            used=used,
            budget=budget.input_budget,
            forecast_need=forecast,
            phase_boundary=phase_boundary(
                window_records(snapshot.records, 0, view.head.thread_id), opened_after
            ),
            open_tool_group=bool(open_calls(own)),
            recovery_boundary=recovery_boundary(
                view.facts or StateView(), view.catalog.paths if view.catalog else (), own
            ),
            low_value_share=low_value_share(own, view.encoding),
        )
        window = view.policy.window
        decision = decide_window(signals, window.levels, window.max_low_value_share)
        if decision.action is WindowAction.PREPARE_ROLLOVER and decision.blocked_by is None:
            self._keep_candidate(view, snapshot, decision.trigger or RolloverTrigger.HARD_LIMIT)
        return decision

    async def roll_over(
        self, view: ThreadView, snapshot: ThreadSnapshot, trigger: RolloverTrigger, started: float
    ) -> tuple[ThreadView, ThreadSnapshot, RolloverReport | None]:
        """Close the window and load the next one: its view, its snapshot carrying what the request
        brought, and the report (None when another prepare closed it first: this one serves the window
        that one opened). ``started``: when the prepare began measuring the window (monotonic)."""
        handoff = self._handoff(view, snapshot, trigger)
        tokens = counter_for("o200k_base").count(render_handoff(handoff))
        async with self._store.connection() as store:
            try:
                await store.commit_window(view.state.view_revision, handoff, tokens)
                report: RolloverReport | None = RolloverReport(
                    trigger=trigger,
                    previous_window=handoff.previous_window,
                    handoff_tokens=tokens,
                    rollover_ms=int((time.monotonic() - started) * 1000),
                )
            except RevisionConflict:
                report = None
            fresh = await self._loader.load(
                store,
                view.head.thread_id,
                tenant=view.scope.tenant,
                session_id=view.head.session_id,
                principal_id=view.scope.principal_id,
            )
        self._candidates.pop(view.head.thread_id, None)
        # What the request brought (evidence, validated additions, hook changes) is the new window's too.
        fresh_snapshot = replace(
            fresh.snapshot(), evidence=snapshot.evidence, additions=snapshot.additions, hooked=snapshot.hooked
        )
        return fresh, fresh_snapshot, report

    def _handoff(self, view: ThreadView, snapshot: ThreadSnapshot, trigger: RolloverTrigger) -> WindowHandoff:
        state = view.facts or StateView()
        last = max((r.seq for r in snapshot.records), default=0)
        candidate = self._candidates.get(view.head.thread_id)
        # Nothing recorded and no state written since ORANGE built it: the candidate is the handoff.
        if (
            candidate is not None
            and candidate.last_event_seq == last
            and candidate.state_version == sum(state.versions.values())
        ):
            return candidate.model_copy(update={"trigger": trigger})
        handoff, _ = roll_over(
            snapshot,
            window=snapshot.window,
            opened_after=_opened_after(view),
            state=state,
            rules=view.catalog.paths if view.catalog else (),
            trigger=trigger,
        )
        return handoff

    def _keep_candidate(self, view: ThreadView, snapshot: ThreadSnapshot, trigger: RolloverTrigger) -> None:
        handoff = self._handoff(view, snapshot, trigger)
        self._candidates[view.head.thread_id] = handoff
        self._candidates.move_to_end(view.head.thread_id)
        while len(self._candidates) > _CANDIDATES:
            self._candidates.popitem(last=False)


def _opened_after(view: ThreadView) -> int:
    return view.window.opened_after if view.window is not None else 0
