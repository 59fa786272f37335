"""Per-profile calibration of local counts for models without an offline tokenizer. Pure.

Anthropic's tokenizer is not shipped (and changes between model versions), so such a profile is
counted with the local o200k count times a factor learned from what the provider itself reported:
the usage of a response (its input tokens vs our local count of that same request) and explicit
context-length refusals. The factor is never below 1: a local count is never trusted to be *more*
than the provider's, since undercounting is the failure that costs a refused request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from contracts import PreparedContext

from services.core.render import REPLY_PRIMING

__all__ = [
    "MAX_FACTOR",
    "MIN_OVERFLOW_RAISE",
    "Calibration",
    "learn_from_usage",
    "raise_on_overflow",
    "request_tokens_before",
    "scaled",
]

# A ratio beyond this is not a tokenizer difference (Claude vs o200k differ by tens of percent) but a
# usage report of some other request; clamping keeps one bad report from starving every context.
MAX_FACTOR: Final = 3.0
# Falling is slow: each report moves the factor this share of the way down to what it observed.
_DECAY: Final = 0.2
# A refused request proves the count short by at least this much, whatever the provider said.
MIN_OVERFLOW_RAISE: Final = 1.05
# Requests this small are mostly framing; their ratio says little about the tokenizer.
_MIN_LOCAL_TOKENS: Final = 64


@dataclass(frozen=True, slots=True)
class Calibration:
    """A profile's factor and the number of usage reports (and overflows) it rests on."""

    factor: float = 1.0
    reports: int = 0


def _bounded(factor: float) -> float:
    return min(MAX_FACTOR, max(1.0, factor))


def learn_from_usage(current: Calibration, provider_input: int, local_count: int) -> Calibration:
    """The factor after one usage report: ``provider_input`` tokens for a request we counted ``local_count``.

    Max-biased: a report above the factor is taken at once, one below only moves it ``_DECAY`` of the
    way down. Overcounting costs a little room in the window; undercounting costs a refused request,
    a forced compaction and a resample — so the factor follows the worst recent request, and forgets
    it only over several reports that all say the provider counts less.
    """
    if local_count < _MIN_LOCAL_TOKENS or provider_input <= 0:
        return current
    observed = _bounded(provider_input / local_count)
    if observed >= current.factor:
        factor = observed
    else:
        factor = current.factor + _DECAY * (observed - current.factor)
    return Calibration(_bounded(factor), current.reports + 1)


def raise_on_overflow(
    current: Calibration, our_estimate: int, provider_count: int | None, provider_limit: int | None
) -> Calibration:
    """The factor after the provider refused a request we estimated at ``our_estimate`` (already scaled
    by ``current.factor``): scaled by what the provider counted over it, by at least 5%.

    Without the provider's count, its limit is a lower bound of that count (it refused the request).
    """
    said = provider_count if provider_count is not None else provider_limit
    ratio = said / our_estimate if said is not None else 1.0
    return Calibration(_bounded(current.factor * max(MIN_OVERFLOW_RAISE, ratio)), current.reports + 1)


def scaled(local: int, factor: float) -> int:
    """``local`` tokens as the provider is expected to count them (rounded up: never an undercount)."""
    return math.ceil(local * factor - 1e-9)


def request_tokens_before(prepared: PreparedContext, response_seq: int) -> int | None:
    """Our local count of the request that produced the response recorded at ``response_seq``, as far
    as this context repeats it: the blocks wholly before the response, the tools and the reply priming.

    ``None`` when this context cannot stand for that request: it was reduced (a masked, trimmed or
    dropped block is not what that request showed), or nothing of it is left in view.
    """
    c = prepared.budget_report.reductions
    if c.trimmed or c.masked or c.dropped_material or c.dropped_history or c.summary_skeleton:
        return None
    before = [b for b in prepared.blocks if b.sources and max(s.seq for s in b.sources) < response_seq]
    if not before:
        return None
    return sum(b.tokens for b in before) + prepared.budget_report.used.tool_schemas + REPLY_PRIMING
