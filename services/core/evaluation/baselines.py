"""The contexts other agents would send at the same point of the same trace, under the same budget.

- ``full``: the whole history (what an agent without context management sends).
- ``window``: system + the run's task + the newest whole units that fit (OpenHands ``recent``,
  LangChain ``trim_messages(strategy="last")``).
- ``masking``: tool outputs older than the newest ``keep_outputs`` replaced by a marker
  (observation masking, "The Complexity Trap", arXiv 2508.21433; Claude Code keeps about 5), then
  the oldest units dropped until it fits.
A unit is never split (see ``chat``). A baseline whose pinned part (system + task) alone exceeds
the budget has no context that fits: it is reported failed, as a provider would reject it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never

from services.core.evaluation.chat import ChatMsg, History, Unit
from services.core.evaluation.fair_count import ContextCounter

__all__ = [
    "BASELINES",
    "DEFAULT_KEEP_OUTPUTS",
    "Baseline",
    "BaselineContext",
    "MASK_MARKER",
    "baseline_context",
    "mask_old_outputs",
]

MASK_MARKER = "[older tool output omitted]"
DEFAULT_KEEP_OUTPUTS = 5


class Baseline(StrEnum):
    """The built-in comparison systems."""

    FULL = "full"
    WINDOW = "window"
    MASKING = "masking"


BASELINES: tuple[Baseline, ...] = (Baseline.FULL, Baseline.WINDOW, Baseline.MASKING)


@dataclass(frozen=True, slots=True)
class BaselineContext:
    """What a baseline sends, its tokens, and whether it exceeds the budget (a failed request)."""

    messages: tuple[ChatMsg, ...]
    tokens: int
    failed: bool


def baseline_context(
    kind: Baseline,
    history: History,
    budget: int,
    counter: ContextCounter,
    *,
    keep_outputs: int = DEFAULT_KEEP_OUTPUTS,
) -> BaselineContext:
    """The context ``kind`` sends for ``history`` under ``budget``."""
    match kind:
        case Baseline.FULL:
            messages = history.messages()
            tokens = counter.context(messages)
            return BaselineContext(tuple(messages), tokens, tokens > budget)
        case Baseline.WINDOW:
            return _newest_that_fit(history, history.units, budget, counter)
        case Baseline.MASKING:
            return _newest_that_fit(history, mask_old_outputs(history.units, keep_outputs), budget, counter)
        case _:
            assert_never(kind)


def mask_old_outputs(units: tuple[Unit, ...], keep_outputs: int) -> tuple[Unit, ...]:
    """Every tool message's content replaced by ``MASK_MARKER`` but the newest ``keep_outputs``."""
    total = sum(u.tool_results for u in units)
    seen = 0
    out: list[Unit] = []
    for unit in units:
        messages: list[ChatMsg] = []
        for m in unit.messages:
            if m.get("role") == "tool":
                seen += 1
                if total - seen >= keep_outputs:
                    m = {**m, "content": MASK_MARKER}
            messages.append(m)
        out.append(Unit(tuple(messages), unit.tool_results))
    return tuple(out)


def _newest_that_fit(
    history: History, units: tuple[Unit, ...], budget: int, counter: ContextCounter
) -> BaselineContext:
    pinned = [*history.system, *history.task]
    used = counter.context(pinned)
    if used > budget:
        return BaselineContext(tuple(pinned), used, True)
    kept: list[Unit] = []
    for unit in reversed(units):
        cost = counter.messages(unit.messages)
        if used + cost > budget:
            break  # a contiguous suffix: skipping one unit would leave a hole in the conversation
        kept.append(unit)
        used += cost
    messages = [*pinned, *(m for u in reversed(kept) for m in u.messages)]
    return BaselineContext(tuple(messages), used, False)
