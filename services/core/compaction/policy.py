"""When to compact: OR-combined triggers, one job per state, and retry throttling. Pure.

Rules (docs/design.md, "Budget and compaction triggers"), one function each:

1. Each enabled trigger fires at ``>=``: ``estimated / InputBudget >= context_ratio``; user turns or
   model steps since the last successful compaction (``totals − baseline``) ``>=`` their period
   (``trigger_hits``).
2. Beside the ratio trigger, a compaction fires as soon as it pays for the prompt cache it
   invalidates (``cache_pays``): the cached reads of what it would remove, summed over the steps
   since the last one, reach what re-sending the rewritten suffix costs beyond a cached read.
3. Several triggers hitting together, or the same state evaluated again, make one job: the job is
   named by a fingerprint of the state, and a thread with a pending job gets no other (``decide``).
4. Nothing compressible → deferred, recorded, not retried on the same state (``decide``). So is a
   compaction that cannot pay for itself (``futile``): only the ratio trigger fires, the view fits
   its budget, and covering everything compressible would still leave it at the ratio — the next
   compaction would follow at once, each rewriting the cached context to save little.
5. A thread whose provider cache is cold, or is about to be, is compacted while it idles
   (``cache_cold``): its next step re-sends its whole prefix whatever the view holds, so a smaller
   view then costs no cache it would have read.
6. While throttled (after a deferral, a failure, or a commit that left the trigger hitting), retry
   only after compressible content grew by ``retry_growth_ratio × InputBudget``, an enabled counter
   grew by another period, a trigger that was not hitting started to, or the budget or the
   required content really changed (``retry_allowed``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Literal

from contracts import CompactionPolicy

__all__ = [
    "CACHE_MISS_PREMIUM",
    "IDLE_MARGIN_S",
    "PROVIDER_CACHE_TTL_S",
    "Counters",
    "Decision",
    "Throttle",
    "ViewMeasure",
    "cache_cold",
    "cache_pays",
    "decide",
    "futile",
    "job_fingerprint",
    "ratio_threshold",
    "retry_allowed",
    "throttle_from",
    "trigger_hits",
]


@dataclass(frozen=True, slots=True)
class Counters:
    """Counter totals (or a baseline) of a thread."""

    user_turns: int = 0
    model_steps: int = 0


@dataclass(frozen=True, slots=True)
class ViewMeasure:
    """What the current view costs, in tokens of the policy's encoding."""

    estimated: int
    required: int
    compressible: int
    budget: int
    # The head of the context a compaction leaves in place (tools, instructions, the run's task):
    # the prefix the provider's prompt cache keeps across it.
    stable: int = 0
    # What a compaction covering everything compressible takes off every later call: the covered
    # history and the current summary, less the summary that replaces them.
    reducible: int = 0


@dataclass(frozen=True, slots=True)
class Throttle:
    """The state at the last attempt that left the thread still hitting a trigger."""

    reason: str
    compressible: int
    user_turns: int
    model_steps: int
    budget: int
    required: int
    hits: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        """For the ``thread_views.throttle`` column."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Throttle:
        """Inverse of :meth:`to_json`."""
        return cls(
            reason=str(data["reason"]),
            compressible=int(data["compressible"]),
            user_turns=int(data["user_turns"]),
            model_steps=int(data["model_steps"]),
            budget=int(data["budget"]),
            required=int(data["required"]),
            hits=tuple(str(h) for h in data["hits"]),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """What the budgeter does with a thread's current state."""

    action: Literal["none", "enqueue", "defer", "throttled", "pending"]
    hits: tuple[str, ...] = ()
    reason: str = ""


# What re-sending a token the cache held costs beyond reading it from the cache, in cached reads:
# gpt-4.1 bills a miss at 4× a cached read. Anthropic's writes (12.5× a read) would compact less
# often, gpt-4o's misses (2×) more; on the eval's samples 1 and 3 cost the same within its noise.
CACHE_MISS_PREMIUM = 3


def ratio_threshold(ratio: float, budget: int) -> int:
    """The smallest token count at which ``tokens / budget >= ratio`` (exact decimal arithmetic)."""
    return math.ceil(Fraction(str(ratio)) * budget)


def trigger_hits(
    measure: ViewMeasure, totals: Counters, baseline: Counters, policy: CompactionPolicy
) -> tuple[str, ...]:
    """The enabled triggers that fire now, in a fixed order."""
    t = policy.triggers
    hits: list[str] = []
    if t.context_ratio is not None and measure.estimated >= ratio_threshold(t.context_ratio, measure.budget):
        hits.append("context_ratio")
    if t.user_turns is not None and totals.user_turns - baseline.user_turns >= t.user_turns:
        hits.append("user_turns")
    if t.model_steps is not None and totals.model_steps - baseline.model_steps >= t.model_steps:
        hits.append("model_steps")
    if t.context_ratio is not None and cache_pays(measure, totals.model_steps - baseline.model_steps):
        hits.append("cache")
    return tuple(hits)


def cache_pays(measure: ViewMeasure, steps: int) -> bool:
    """Whether compacting now costs less, per step, than carrying what it removes any longer.

    A compaction rewrites the context after its stable head, so the next call reads none of that
    from the provider's cache: a one-off premium of ``CACHE_MISS_PREMIUM`` cached reads per rewritten
    token. Not compacting, every call reads the ``reducible`` tokens again. While the history grows
    steadily, the ``steps`` since the last compaction have read about ``steps × reducible / 2`` of
    them; the cost per step of a cycle is lowest when that sum equals the premium (the economic
    order quantity), which is when this fires.
    """
    rewritten = measure.estimated - measure.reducible - measure.stable
    if measure.reducible <= 0 or steps <= 0:
        return False
    return steps * measure.reducible >= 2 * CACHE_MISS_PREMIUM * max(rewritten, 0)


# How long each provider keeps a prompt prefix nobody sends: OpenAI's automatic cache and Anthropic's
# default breakpoints both 5 minutes (Anthropic's 1-hour TTL is an opt-in a caller states).
PROVIDER_CACHE_TTL_S: dict[str, float] = {"openai": 300.0, "anthropic": 300.0}

# How long before the cache goes cold an idle thread is compacted: room for a compaction to commit
# before a next step that comes at the end of the TTL (the eval's think time is 20 s a step).
IDLE_MARGIN_S = 60.0


def cache_cold(
    measure: ViewMeasure,
    idle_s: float,
    ttl_s: float,
    *,
    compacted_while_idle: bool = False,
    margin_s: float = IDLE_MARGIN_S,
) -> bool:
    """Whether to compact a thread that has been idle ``idle_s`` since its last context was served.

    Past ``ttl_s − margin_s`` the provider has dropped the thread's cached prefix, or will have by
    the time a next step comes, so that step pays every token of its context at the uncached price
    however the view looks: a compaction then, covering all that is reducible, costs no cache read
    and makes that step and every later one smaller. Once per idle spell: a compaction committed
    since the last context was served (``compacted_while_idle``) has already taken what there was.
    """
    if compacted_while_idle or measure.reducible <= 0:
        return False
    return idle_s >= max(ttl_s - margin_s, 0.0)


def retry_allowed(
    throttle: Throttle,
    measure: ViewMeasure,
    totals: Counters,
    hits: tuple[str, ...],
    policy: CompactionPolicy,
) -> bool:
    """Whether a throttled thread has changed enough to be worth another attempt."""
    t = policy.triggers
    if measure.compressible - throttle.compressible >= math.ceil(
        Fraction(str(policy.retry_growth_ratio)) * measure.budget
    ):
        return True
    if t.user_turns is not None and totals.user_turns - throttle.user_turns >= t.user_turns:
        return True
    if t.model_steps is not None and totals.model_steps - throttle.model_steps >= t.model_steps:
        return True
    if measure.budget != throttle.budget or measure.required != throttle.required:
        return True
    return any(h not in throttle.hits for h in hits)


def decide(
    measure: ViewMeasure,
    totals: Counters,
    baseline: Counters,
    policy: CompactionPolicy,
    *,
    throttle: Throttle | None,
    pending: bool,
) -> Decision:
    """The budgeter's decision for one thread state."""
    hits = trigger_hits(measure, totals, baseline, policy)
    if not hits:
        return Decision("none")
    if pending:
        return Decision("pending", hits, "a job for this thread is already queued")
    if throttle is not None and not retry_allowed(throttle, measure, totals, hits, policy):
        return Decision("throttled", hits, f"waiting for growth since: {throttle.reason}")
    if measure.compressible <= 0:
        return Decision("defer", hits, "nothing_compressible")
    if futile(measure, hits, policy):
        return Decision("defer", hits, "cannot_get_under_ratio")
    return Decision("enqueue", hits)


def futile(measure: ViewMeasure, hits: tuple[str, ...], policy: CompactionPolicy) -> bool:
    """Whether the only trigger is the ratio and no compaction can take the view under it.

    When the required content alone is near the ratio, every compaction saves a little and leaves
    the trigger hitting, and each one costs the prompt cache the context after its stable head.
    It waits instead: for the cache trigger (what it saves then pays for the rewrite), a counter
    trigger, or the view outgrowing its budget (which a prepare compacts at once, urgently).
    A measure that does not say what a compaction takes off (``reducible`` 0) is not judged here:
    the compactor's own reduction check stands for it.
    """
    ratio = policy.triggers.context_ratio
    if hits != ("context_ratio",) or ratio is None or measure.estimated > measure.budget:
        return False
    if measure.reducible <= 0:
        return False
    return measure.estimated - measure.reducible >= ratio_threshold(ratio, measure.budget)


def throttle_from(reason: str, measure: ViewMeasure, totals: Counters, hits: tuple[str, ...]) -> Throttle:
    """The throttle to record after an attempt that leaves the thread hitting a trigger."""
    return Throttle(
        reason=reason,
        compressible=measure.compressible,
        user_turns=totals.user_turns,
        model_steps=totals.model_steps,
        budget=measure.budget,
        required=measure.required,
        hits=hits,
    )


def job_fingerprint(
    thread_id: str,
    watermark: int,
    view_revision: int,
    policy_name: str,
    policy_revision: int,
    budget: int,
    *,
    urgent: bool = False,
) -> str:
    """The identity of a compaction job: same sources, view, policy, budget and urgency → same job."""
    key = (
        f"{thread_id}|{watermark}|{view_revision}|{policy_name}@{policy_revision}|{budget}|"
        f"{'urgent' if urgent else 'proactive'}"
    )
    return hashlib.sha256(key.encode()).hexdigest()[:32]
