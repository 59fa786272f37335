"""The one rule for what counts as a user turn and as a model step. Pure.

The recorder counts wire events into the thread head; the view, the budgeter and the summarizers
count records. Both sides ask here, so a head's counters and a view's totals cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable

from contracts import AssistantMessagePayload, UserInputPayload
from services.core.records import LedgerRecord, RecordBody

__all__ = ["counts_as_step", "counts_as_turn", "is_model_step", "is_new_question", "turns_and_steps"]


def is_new_question(intent: str) -> bool:
    """A user input counts as a turn once, when it asks a new question; a supplement never does."""
    return intent == "question"


def is_model_step(purpose: str) -> bool:
    """A stored model response counts as a step when it acts; a completion check's answer never does."""
    return purpose == "action"


def counts_as_turn(body: RecordBody) -> bool:
    return isinstance(body, UserInputPayload) and is_new_question(body.intent)


def counts_as_step(body: RecordBody) -> bool:
    return isinstance(body, AssistantMessagePayload) and is_model_step(body.purpose)


def turns_and_steps(records: Iterable[LedgerRecord]) -> tuple[int, int]:
    """``(user turns, model steps)`` among ``records``."""
    turns = steps = 0
    for r in records:
        turns += counts_as_turn(r.body)
        steps += counts_as_step(r.body)
    return turns, steps
