"""Triggers, one job per state, and retry throttling, with fixed budgets."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from contracts import CompactionPolicy, CompactionTriggers, ContextPolicy
from services.core.compaction.policy import (
    CACHE_MISS_PREMIUM,
    Counters,
    Throttle,
    ViewMeasure,
    cache_pays,
    decide,
    futile,
    job_fingerprint,
    throttle_from,
    trigger_hits,
)
from services.app.views import count_totals
from tests.fixtures.builders import Thread, ledger_records

BUDGET = 100_000  # the seed's worked example: 80% fires at exactly 80,000 tokens
RATIO_ONLY = CompactionPolicy()
ZERO = Counters()


def _m(
    estimated: int, compressible: int = 10_000, required: int = 5_000, budget: int = BUDGET
) -> ViewMeasure:
    return ViewMeasure(estimated=estimated, required=required, compressible=compressible, budget=budget)


def _policy(**triggers: object) -> CompactionPolicy:
    return CompactionPolicy(triggers=CompactionTriggers(**triggers))  # type: ignore[arg-type]


def test_ratio_trigger_79999_does_not_fire_and_80000_does() -> None:
    assert trigger_hits(_m(79_999), ZERO, ZERO, RATIO_ONLY) == ()
    assert trigger_hits(_m(80_000), ZERO, ZERO, RATIO_ONLY) == ("context_ratio",)


def test_ratio_threshold_is_exact_for_awkward_ratios_and_budgets() -> None:
    policy = _policy(context_ratio=0.7, user_turns=None)
    # 0.7 * 30,001 = 21,000.7 → the first firing count is 21,001, not a float-rounded neighbour.
    assert trigger_hits(_m(21_000, budget=30_001), ZERO, ZERO, policy) == ()
    assert trigger_hits(_m(21_001, budget=30_001), ZERO, ZERO, policy) == ("context_ratio",)


def test_nth_question_and_mth_step_fire_at_low_token_use() -> None:
    policy = _policy(context_ratio=0.8, user_turns=3, model_steps=5)
    low = _m(1_000)
    assert trigger_hits(low, Counters(2, 4), ZERO, policy) == ()
    assert trigger_hits(low, Counters(3, 0), ZERO, policy) == ("user_turns",)
    assert trigger_hits(low, Counters(0, 5), ZERO, policy) == ("model_steps",)
    # "since the last successful compaction" is totals − baseline
    assert trigger_hits(low, Counters(5, 9), Counters(3, 5), policy) == ()
    assert trigger_hits(low, Counters(6, 10), Counters(3, 5), policy) == ("user_turns", "model_steps")


def test_or_combined_hits_make_one_job_decision() -> None:
    policy = _policy(context_ratio=0.8, user_turns=1, model_steps=1)
    decision = decide(_m(90_000), Counters(1, 1), ZERO, policy, throttle=None, pending=False)
    assert decision.action == "enqueue" and decision.hits == ("context_ratio", "user_turns", "model_steps")


def test_a_thread_with_a_pending_job_gets_no_second_one() -> None:
    decision = decide(_m(90_000), ZERO, ZERO, RATIO_ONLY, throttle=None, pending=True)
    assert decision.action == "pending"


def test_nothing_compressible_defers_and_the_same_state_is_not_retried() -> None:
    measure = _m(90_000, compressible=0)
    first = decide(measure, ZERO, ZERO, RATIO_ONLY, throttle=None, pending=False)
    assert (first.action, first.reason) == ("defer", "nothing_compressible")
    throttle = throttle_from(first.reason, measure, ZERO, first.hits)
    again = decide(measure, ZERO, ZERO, RATIO_ONLY, throttle=throttle, pending=False)
    assert again.action == "throttled"


def test_required_at_82_percent_retries_only_past_the_growth_threshold() -> None:
    # Required content alone is 82% of the budget; each loop adds a little compressible content.
    start = _m(82_500, compressible=500, required=82_000)
    throttle = throttle_from("committed_still_over", start, ZERO, ("context_ratio",))
    for added in range(1_000, 5_000, 1_000):  # below 5% of 100,000 tokens
        loop = _m(82_500 + added, compressible=500 + added, required=82_000)
        assert decide(loop, ZERO, ZERO, RATIO_ONLY, throttle=throttle, pending=False).action == "throttled"
    grown = _m(87_500, compressible=5_500, required=82_000)  # +5,000 = retry_growth_ratio × budget
    assert decide(grown, ZERO, ZERO, RATIO_ONLY, throttle=throttle, pending=False).action == "enqueue"


def test_throttle_lifts_on_a_new_counter_period_budget_change_or_newly_hit_condition() -> None:
    policy = _policy(context_ratio=0.8, user_turns=4)
    m = _m(85_000)
    throttle = Throttle("failed:summarize", 10_000, 1, 0, BUDGET, 5_000, ("context_ratio",))
    assert (
        decide(m, Counters(4, 0), ZERO, policy, throttle=throttle, pending=False).action == "enqueue"
    )  # newly hit
    assert decide(m, Counters(2, 0), ZERO, policy, throttle=throttle, pending=False).action == "throttled"
    throttle2 = Throttle("failed:summarize", 10_000, 4, 0, BUDGET, 5_000, ("context_ratio", "user_turns"))
    assert decide(m, Counters(7, 0), ZERO, policy, throttle=throttle2, pending=False).action == "throttled"
    assert (
        decide(m, Counters(8, 0), ZERO, policy, throttle=throttle2, pending=False).action == "enqueue"
    )  # +1 period
    assert (
        decide(_m(85_000, budget=90_000), ZERO, ZERO, policy, throttle=throttle, pending=False).action
        == "enqueue"
    )
    assert (
        decide(_m(85_000, required=6_000), ZERO, ZERO, policy, throttle=throttle, pending=False).action
        == "enqueue"
    )


def test_job_fingerprint_names_the_state_and_urgency() -> None:
    a = job_fingerprint("r.main", 10, 0, "default", 1, 1000)
    assert a == job_fingerprint("r.main", 10, 0, "default", 1, 1000)
    others = {
        job_fingerprint("r.main", 11, 0, "default", 1, 1000),
        job_fingerprint("r.main", 10, 1, "default", 1, 1000),
        job_fingerprint("r.main", 10, 0, "default", 2, 1000),
        job_fingerprint("r.main", 10, 0, "default", 1, 999),
        job_fingerprint("r.main", 10, 0, "default", 1, 1000, urgent=True),
    }
    assert a not in others and len(others) == 5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"triggers": {"context_ratio": None}}, "at least one trigger"),
        ({"triggers": {"context_ratio": 1.0}}, "less than 1"),
        ({"triggers": {"context_ratio": 0.0}}, "greater than 0"),
        ({"triggers": {"context_ratio": 0.5}, "target_context_ratio": 0.6}, "must be below"),
        ({"triggers": {"user_turns": 0}}, "greater than 0"),
        ({"triggers": {"model_steps": -2}}, "greater than 0"),
        ({"max_compaction_calls": 0}, "greater than 0"),
        ({"retry_growth_ratio": 1.5}, "less than 1"),
    ],
)
def test_policy_validation_refuses_what_seed_000_refuses(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CompactionPolicy.model_validate(fields)


def test_policy_with_turns_only_and_no_ratio_is_valid_and_any_target_below_one_is_fine() -> None:
    policy = CompactionPolicy.model_validate(
        {"triggers": {"context_ratio": None, "user_turns": 3}, "target_context_ratio": 0.9}
    )
    assert policy.triggers.user_turns == 3
    assert ContextPolicy(name="p", model_profile=None, budget_tokens=16_000).budget_tokens == 16_000


def test_counting_supplements_completions_and_retries_never_add() -> None:
    t = Thread()
    events = [
        t.user("question one"),
        t.user("and please hurry", key="supp"),
        t.assistant("step"),
        t.assistant("is it done?", key="check"),
    ]
    events[1] = events[1].model_copy(
        update={"payload": events[1].payload.model_copy(update={"intent": "supplement"})}
    )
    events[3] = events[3].model_copy(
        update={"payload": events[3].payload.model_copy(update={"purpose": "completion"})}
    )
    records = ledger_records([*events, events[0]])  # the repeated question is a duplicate, not a record
    assert count_totals(records) == Counters(user_turns=1, model_steps=1)


def _cached(estimated: int, reducible: int, stable: int = 1_000) -> ViewMeasure:
    # Far below the 80% ratio trigger, so only the cache trigger can fire.
    return ViewMeasure(estimated, 5_000, reducible, BUDGET, stable=stable, reducible=reducible)


def test_cache_trigger_fires_once_the_reads_of_what_it_removes_outweigh_the_rewrite() -> None:
    # 10,000 tokens a compaction would take off every call; it rewrites 20,000 − 10,000 − 1,000.
    measure = _cached(20_000, 10_000)
    premium_reads = 2 * CACHE_MISS_PREMIUM * 9_000
    steps = math.ceil(premium_reads / 10_000)
    assert not cache_pays(measure, steps - 1)
    assert cache_pays(measure, steps)
    assert trigger_hits(measure, Counters(0, steps), ZERO, RATIO_ONLY) == ("cache",)


def test_cache_trigger_counts_only_the_steps_since_the_last_compaction() -> None:
    measure = _cached(20_000, 10_000)
    many = 10 * CACHE_MISS_PREMIUM
    assert trigger_hits(measure, Counters(0, many), ZERO, RATIO_ONLY) == ("cache",)
    assert trigger_hits(measure, Counters(0, many), Counters(0, many), RATIO_ONLY) == ()


def test_cache_trigger_waits_longer_the_more_a_compaction_rewrites() -> None:
    small_rewrite, large_rewrite = _cached(12_000, 10_000), _cached(40_000, 10_000)
    steps = next(n for n in range(1, 1_000) if cache_pays(small_rewrite, n))
    assert not cache_pays(large_rewrite, steps)


def test_cache_trigger_never_fires_for_a_compaction_that_removes_nothing() -> None:
    assert not cache_pays(_cached(20_000, 0), 10_000)
    assert not cache_pays(_cached(20_000, -500), 10_000)


def test_cache_trigger_is_off_when_the_ratio_trigger_is_off() -> None:
    turns_only = _policy(context_ratio=None, user_turns=50)
    assert trigger_hits(_cached(20_000, 10_000), Counters(0, 1_000), ZERO, turns_only) == ()


def test_a_ratio_hit_no_compaction_can_get_under_waits_until_the_cache_pays_or_the_view_is_over() -> None:
    # Required content is 78% of the budget: covering all 3,000 compressible tokens leaves 81%.
    near = ViewMeasure(estimated=84_000, required=78_000, compressible=3_000, budget=BUDGET, reducible=3_000)
    assert futile(near, ("context_ratio",), RATIO_ONLY)
    deferred = decide(near, ZERO, ZERO, RATIO_ONLY, throttle=None, pending=False)
    assert (deferred.action, deferred.reason) == ("defer", "cannot_get_under_ratio")
    # Recorded as a throttle: the same state is not tried again.
    throttle = throttle_from(deferred.reason, near, ZERO, deferred.hits)
    assert decide(near, ZERO, ZERO, RATIO_ONLY, throttle=throttle, pending=False).action == "throttled"
    # A compaction that can take the view under the ratio goes ahead.
    under = ViewMeasure(
        estimated=84_000, required=60_000, compressible=20_000, budget=BUDGET, reducible=20_000
    )
    assert decide(under, ZERO, ZERO, RATIO_ONLY, throttle=None, pending=False).action == "enqueue"
    # So does one the cache trigger pays for, one a counter asks for, and one over the budget.
    assert not futile(near, ("context_ratio", "cache"), RATIO_ONLY)
    assert not futile(near, ("context_ratio", "model_steps"), RATIO_ONLY)
    over = ViewMeasure(estimated=101_000, required=95_000, compressible=3_000, budget=BUDGET, reducible=3_000)
    assert decide(over, ZERO, ZERO, RATIO_ONLY, throttle=None, pending=False).action == "enqueue"
