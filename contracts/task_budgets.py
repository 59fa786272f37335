"""Task budgets: what a whole task may spend, and the ledger of what it has spent.

A runtime declares a run's ``TaskBudget`` once, on the run's first event (the envelope's
``task_budget``; the fleet keeps it with the run), or in a prepare request
(``PrepareRequest.task_budget``), which overrides the run's for that prepare. The fleet keeps the
``BudgetLedger`` from what the ledger recorded — the provider's usage an assistant message reports
(``CallUsage``) where present, local counts otherwise — so the ledger itself needs no persisting
beyond the records. A spent hard budget is the typed refusal ``task_budget_exhausted`` carrying the
report; a soft one only reports.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from ._base import WireModel, forbidden_shapes

__all__ = ["TASK_BUDGET_DIMENSIONS", "BudgetLedger", "CallUsage", "TaskBudget", "TaskBudgetReport"]

_Limit = Annotated[int, Field(gt=0, le=10_000_000_000)]
# Cost in the provider's billing currency (what ``CallUsage.cost`` reports), e.g. US dollars.
_Cost = Annotated[float, Field(gt=0, le=1_000_000_000, allow_inf_nan=False)]


class CallUsage(WireModel):
    """What the provider reported for one model call (an assistant message's ``usage``)."""

    input_tokens: Annotated[int, Field(ge=0, le=10_000_000_000)]
    output_tokens: Annotated[int, Field(ge=0, le=10_000_000_000)]
    # What the provider billed for the call, when it says (same currency across a run).
    cost: Annotated[float, Field(ge=0, le=1_000_000_000, allow_inf_nan=False)] | None = None


# The limited dimensions, in report order: each is a field of both TaskBudget and BudgetLedger.
TASK_BUDGET_DIMENSIONS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "model_calls",
    "tool_calls",
    "runtime_seconds",
    "cost",
)


class TaskBudget(WireModel):
    """Limits on what one run may spend; at least one is set."""

    input_tokens: _Limit | None = None
    output_tokens: _Limit | None = None
    total_tokens: _Limit | None = None
    model_calls: _Limit | None = None
    tool_calls: _Limit | None = None
    # Seconds from the run's first record to its newest (the fleet's clock, not the runtime's).
    runtime_seconds: _Limit | None = None
    # What the provider reported the run's calls cost (``CallUsage.cost``); unreported calls add nothing.
    cost: _Cost | None = None
    # Hard: a spent dimension refuses the next prepare. Soft: it is only reported.
    hard: bool = True

    # ``_limits_something`` in the schema: one of the limits present and not null.
    model_config = ConfigDict(
        json_schema_extra=forbidden_shapes(
            {"properties": {name: {"type": "null"} for name in TASK_BUDGET_DIMENSIONS}},
        )
    )

    @model_validator(mode="after")
    def _limits_something(self) -> TaskBudget:
        limits = (
            self.input_tokens,
            self.output_tokens,
            self.total_tokens,
            self.model_calls,
            self.tool_calls,
            self.runtime_seconds,
            self.cost,
        )
        if all(v is None for v in limits):
            raise ValueError(
                "a task budget limits at least one of input_tokens, output_tokens, total_tokens, "
                "model_calls, tool_calls, runtime_seconds, cost"
            )
        return self


class BudgetLedger(WireModel):
    """What a run has spent, from its recorded model calls (assistant messages) and tool calls."""

    model_calls: int = 0
    tool_calls: int = 0
    # Per model call: the provider's reported output tokens, else the local count of the response.
    output_tokens: int = 0
    # Per model call: the provider's reported input tokens, else the run's history recorded before
    # it, capped at the input budget — the most that call can have been sent (compaction only makes
    # it less), so a hard budget never runs over on an estimate.
    input_tokens: int = 0
    total_tokens: int = 0
    # Whole seconds from the run's first record to its newest (recorded_at, the fleet's clock).
    runtime_seconds: int = 0
    # The sum of the reported costs; calls that reported none add nothing (see ``priced_calls``).
    cost: float = 0.0
    # Which numbers are the provider's: calls whose tokens were reported (the other
    # ``model_calls - reported_calls`` are local estimates), and calls whose cost was reported.
    reported_calls: int = 0
    priced_calls: int = 0


class TaskBudgetReport(WireModel):
    """A run's budget, what it spent, what is left per limited dimension, and which are spent."""

    # The declared limits (the limited dimensions only), and whether they are hard. ``cost`` is the
    # one dimension that is not a whole number.
    limits: dict[str, int | float]
    hard: bool
    spent: BudgetLedger
    # One entry per limited dimension: its limit minus what is spent (never below 0).
    remaining: dict[str, int | float]
    # The limited dimensions whose spending reached the limit, in field order.
    exhausted: tuple[str, ...] = ()
