"""Money per task beyond the agent's own calls: the summarizer's calls, pauses and the output floor."""

from __future__ import annotations

import pytest

from services.core.evaluation import (
    FleetContext,
    FleetFailure,
    FleetOutcome,
    SummarizerCall,
    summarizer_calls,
)
from services.core.evaluation.cost import (
    Bill,
    Call,
    Price,
    bill_calls,
    bill_summarizer,
    cached_floor_ratio,
    floor_ratio,
    with_pauses,
)

PRICE = Price(provider="openai", input=1.0, cached_input=0.1, output=4.0)


def test_a_summarizer_call_is_billed_uncached_and_added_to_the_total() -> None:
    bill = bill_calls([Call(("a",), (2_000,), 0, output_tokens=100)], PRICE)
    before = bill.usd
    bill_summarizer(bill, 3_000, 500, PRICE)
    assert bill.summarizer_calls == 1
    assert (bill.summarizer_input_tokens, bill.summarizer_output_tokens) == (3_000, 500)
    assert bill.summarizer_usd == pytest.approx((3_000 + 500 * 4) / 1e6)
    assert bill.usd == pytest.approx(before + bill.summarizer_usd)


def test_merged_bills_add_their_summarizer_calls() -> None:
    a, b = Bill(), Bill()
    bill_summarizer(a, 100, 10, PRICE)
    bill_summarizer(b, 200, 20, PRICE)
    a.merge(b)
    assert (a.summarizer_calls, a.summarizer_input_tokens, a.summarizer_output_tokens) == (2, 300, 30)
    assert a.as_json(1)["summarizer"] == {
        "calls": 2,
        "input_tokens": 300,
        "output_tokens": 30,
        "usd": 0.00042,
    }


def test_the_floor_is_the_replies_alone_against_the_baseline() -> None:
    fleet = Bill(calls=1, input_tokens=10_000, output_tokens=1_000, usd=0.006)
    masking = Bill(calls=1, input_tokens=40_000, output_tokens=1_000, usd=0.016)
    assert floor_ratio(fleet, masking, PRICE) == pytest.approx(0.004 / 0.016)
    assert floor_ratio(fleet, Bill(), PRICE) is None


def test_the_cached_floor_reads_every_token_sent_from_the_cache_and_drops_the_summarizer() -> None:
    fleet = Bill(calls=1, input_tokens=10_000, output_tokens=1_000, usd=0.006)
    bill_summarizer(fleet, 3_000, 500, PRICE)
    masking = Bill(calls=1, input_tokens=40_000, output_tokens=1_000, usd=0.016)
    assert cached_floor_ratio(fleet, masking, PRICE) == pytest.approx((0.004 + 10_000 * 0.1 / 1e6) / 0.016)


def test_pauses_delay_every_nth_call_and_all_after_it() -> None:
    assert with_pauses([0, 20, 40, 60, 80], 2, 400) == [0, 420, 440, 860, 880]
    assert with_pauses([0, 20], 0, 400) == [0, 20]


def _shown(summary_id: str | None, covered_to: int, summary: int, *records: tuple[int, int]) -> FleetContext:
    return FleetContext(
        (), summary_tokens=summary, summary_id=summary_id, covered_to=covered_to, record_tokens=records
    )


def test_each_new_summary_is_one_summarizer_call_over_what_it_newly_covers() -> None:
    fleet: list[FleetOutcome] = [
        _shown(None, 0, 0, (1, 100), (2, 300)),
        _shown(None, 0, 0, (2, 250), (3, 400)),
        _shown("s1", 2, 50, (3, 400)),
        _shown("s1", 2, 50, (3, 400), (4, 80)),
        FleetFailure("budget_exceeded", "no room"),
        _shown("s2", 4, 70),
    ]
    calls = summarizer_calls(fleet, prompt_tokens=1_000)
    # s1: instructions + records 1 and 2 (2 at the most a context showed it); s2: + s1 + records 3, 4.
    assert calls == [SummarizerCall(3, 1_000 + 100 + 300, 50), SummarizerCall(6, 1_000 + 50 + 400 + 80, 70)]


def test_a_thread_never_summarized_makes_no_summarizer_call() -> None:
    assert summarizer_calls([_shown(None, 0, 0, (1, 100))], prompt_tokens=1_000) == []
