"""Task budgets (seed 004 §26–27): what a whole task may spend, and the ledger of what it has spent.

A runtime declares a run's ``TaskBudget`` in its prepare requests (``PrepareRequest.task_budget``);
the fleet keeps the ``BudgetLedger`` from what the ledger recorded, so nothing about it needs
persisting beyond the records themselves. A spent hard budget is the typed refusal
``task_budget_exhausted`` carrying the report; a soft one only reports.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from ._base import WireModel

__all__ = ["BudgetLedger", "TaskBudget", "TaskBudgetReport"]

_Limit = Annotated[int, Field(gt=0, le=10_000_000_000)]


class TaskBudget(WireModel):
    """Limits on what one run may spend; at least one is set."""

    input_tokens: _Limit | None = None
    output_tokens: _Limit | None = None
    total_tokens: _Limit | None = None
    model_calls: _Limit | None = None
    tool_calls: _Limit | None = None
    # Hard: a spent dimension refuses the next prepare. Soft: it is only reported.
    hard: bool = True

    @model_validator(mode="after")
    def _limits_something(self) -> TaskBudget:
        if all(v is None for v in (self.input_tokens, self.output_tokens, self.total_tokens)) and (
            self.model_calls is None and self.tool_calls is None
        ):
            raise ValueError(
                "a task budget limits at least one of input_tokens, output_tokens, total_tokens, "
                "model_calls, tool_calls"
            )
        return self


class BudgetLedger(WireModel):
    """What a run has spent, from its recorded model calls (assistant messages) and tool calls."""

    model_calls: int = 0
    tool_calls: int = 0
    # Local counts of the recorded responses.
    output_tokens: int = 0
    # Per model call, the run's history recorded before it, capped at the input budget: the most
    # that call can have been sent (compaction only makes it less), so a hard budget never runs over.
    input_tokens: int = 0
    total_tokens: int = 0


class TaskBudgetReport(WireModel):
    """A run's budget, what it spent, what is left per limited dimension, and which are spent."""

    # The declared limits (the limited dimensions only), and whether they are hard.
    limits: dict[str, int]
    hard: bool
    spent: BudgetLedger
    # One entry per limited dimension: its limit minus what is spent (never below 0).
    remaining: dict[str, int]
    # The limited dimensions whose spending reached the limit, in field order.
    exhausted: tuple[str, ...] = ()
