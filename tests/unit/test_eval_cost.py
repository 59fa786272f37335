"""Money per task: the provider cache simulations on small, hand-computed calls."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from services.core.evaluation import (
    CTXFLEET,
    ContextCounter,
    FleetContext,
    FleetOutcome,
    history_of,
    prepare_points,
    score_trace,
)
from services.core.evaluation.cost import (
    BUILTIN_PRICES,
    Bill,
    Call,
    Price,
    bill_calls,
    call_of,
    call_times,
    price_table,
)
from services.core.tokens import counter_for
from services.core.trace import TraceLine
from contracts.exceptions import InvalidConfiguration

from .test_eval_synthetic import TraceBuilder

# Round prices per million tokens, so each expected dollar figure reads off the token counts.
OPENAI = Price(provider="openai", input=1.0, cached_input=0.1, output=4.0)
ANTHROPIC = Price(provider="anthropic", input=1.0, cached_input=0.1, output=4.0, cache_write=1.25)


def _call(keys: str, tokens: tuple[int, ...], at_s: float, breakpoints: tuple[int, ...] = ()) -> Call:
    return Call(tuple(keys), tokens, at_s, output_tokens=0, breakpoints=breakpoints)


def _bill(price: Price, *calls: Call) -> Bill:
    """The bill of the last call alone, after the ones before it filled the cache."""
    total, before = bill_calls(calls, price), bill_calls(calls[:-1], price)
    return Bill(
        total.calls - before.calls,
        total.input_tokens - before.input_tokens,
        total.cached_tokens - before.cached_tokens,
        total.written_tokens - before.written_tokens,
        total.output_tokens - before.output_tokens,
        round(total.usd - before.usd, 9),
    )


def test_openai_call_reads_shared_prefix_in_128_token_increments_past_1024():
    first = _call("ab", (1500, 500), 0)
    second = _call("abc", (1500, 500, 300), 20)
    # 2,000 shared tokens: 1,024 + 7 × 128 = 1,920 cached, the other 380 at the input price.
    assert _bill(OPENAI, first, second) == Bill(1, 2300, 1920, 0, 0, round((380 + 1920 * 0.1) / 1e6, 9))


def test_openai_call_reads_nothing_when_shared_prefix_is_under_1024_tokens():
    assert _bill(OPENAI, _call("ab", (1000, 500), 0), _call("ac", (1000, 700), 20)).cached_tokens == 0


def test_openai_call_misses_after_cache_idles_past_ttl():
    first = _call("ab", (1500, 500), 0)
    assert _bill(OPENAI, first, _call("abc", (1500, 500, 300), 300)).cached_tokens == 1920
    assert _bill(OPENAI, first, _call("abc", (1500, 500, 300), 301)).cached_tokens == 0


def test_openai_cache_stays_warm_while_calls_keep_sending_the_prefix():
    calls = [_call("ab", (1500, 500), 0), _call("ab", (1500, 500), 250), _call("ab", (1500, 500), 500)]
    assert _bill(OPENAI, *calls).cached_tokens == 1920


def test_openai_call_misses_after_compaction_rewrites_the_prefix():
    before = _call("stab", (1100, 200, 900, 800), 0)
    # The summary replaced what followed the system and task: only those 1,300 tokens are shared.
    compacted = _call("stSc", (1100, 200, 400, 300), 20)
    assert _bill(OPENAI, before, compacted).cached_tokens == 1024 + 2 * 128
    # A compaction that rewrites the very first message shares nothing.
    assert _bill(OPENAI, before, _call("Xtab", (1100, 200, 900, 800), 20)).cached_tokens == 0


def test_anthropic_first_call_pays_the_write_premium_up_to_its_last_breakpoint():
    first = Call(tuple("stm"), (1200, 300, 500), 0, output_tokens=100, breakpoints=(1, 3), tail_tokens=3)
    bill = bill_calls([first], ANTHROPIC)
    # 2,000 tokens written at 1.25, the 3 of the reply priming at 1.0, 100 out at 4.0.
    assert bill == Bill(1, 2003, 0, 2000, 100, pytest.approx((2000 * 1.25 + 3 + 400) / 1e6))


def test_anthropic_call_reads_the_previous_breakpoint_and_writes_what_follows():
    first = _call("stm", (1200, 300, 500), 0, (1, 3))
    second = _call("stmn", (1200, 300, 500, 400), 60, (1, 4))
    assert _bill(ANTHROPIC, first, second) == Bill(1, 2400, 2000, 400, 0, round((200 + 500) / 1e6, 9))


def test_anthropic_call_misses_and_writes_again_after_ttl():
    first = _call("stm", (1200, 300, 500), 0, (1, 3))
    late = _bill(ANTHROPIC, first, _call("stmn", (1200, 300, 500, 400), 301, (1, 4)))
    assert (late.cached_tokens, late.written_tokens) == (0, 2400)


def test_anthropic_read_restarts_the_ttl():
    calls = [
        _call("stm", (1200, 300, 500), 0, (3,)),
        _call("stmn", (1200, 300, 500, 400), 250, (3,)),  # reads the entry at 3 and refreshes it
        _call("stmo", (1200, 300, 500, 100), 500, (3,)),
    ]
    assert _bill(ANTHROPIC, *calls).cached_tokens == 2000


def test_anthropic_writes_nothing_under_the_minimum_and_reads_nothing_without_breakpoints():
    short = _bill(ANTHROPIC, _call("sm", (500, 300), 0, (1, 2)))
    assert (short.cached_tokens, short.written_tokens) == (0, 0)
    first = _call("stm", (1200, 300, 500), 0, (1, 3))
    unmarked = _bill(ANTHROPIC, first, _call("stm", (1200, 300, 500), 10))
    assert (unmarked.cached_tokens, unmarked.written_tokens) == (0, 0)


def test_anthropic_compaction_reads_the_system_breakpoint_and_writes_the_new_head():
    first = _call("stab", (1100, 200, 900, 800), 0, (1, 4))
    compacted = _call("stS", (1100, 200, 400), 20, (1, 3))
    assert _bill(ANTHROPIC, first, compacted) == Bill(1, 1700, 1100, 600, 0, round((110 + 750) / 1e6, 9))


def test_call_of_puts_tools_first_and_shifts_message_breakpoints_past_them():
    counter = ContextCounter(counter_for("o200k_base"))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    tools = [{"name": "bash", "parameters": {"type": "object"}}]
    call = call_of(messages, tools, counter, at_s=5.0, output_tokens=7, breakpoints=(1, 2))
    assert call.breakpoints == (1, 2, 3)
    assert len(call.keys) == 3 and call.tokens[1:] == tuple(counter.message(m) for m in messages)
    assert call_of(messages, (), counter, at_s=0, output_tokens=0, breakpoints=(0, 2, 9)).breakpoints == (2,)


def _line(n: int, ts: str | None = None) -> TraceLine:
    return TraceLine(line=n, kind="user_input", text="x", ts=ts)


def test_call_times_follow_the_trace_timestamps():
    start = datetime(2024, 1, 1, 9, 0)
    # A stamp without a zone reads as UTC beside one with it.
    later = (start + timedelta(minutes=7, seconds=30)).replace(tzinfo=UTC)
    lines = [_line(1, start.isoformat()), _line(2), _line(3, later.isoformat()), _line(4)]
    assert call_times(lines, [1, 3]) == [0.0, 450.0]


def test_call_times_fall_back_to_the_default_step_without_timestamps():
    lines = [_line(n) for n in range(1, 6)]
    assert call_times(lines, [1, 2, 4], step_s=30) == [0.0, 30.0, 60.0]


def test_price_table_lays_overrides_over_the_builtin_prices():
    table = price_table({"claude-sonnet-4": {"cache_ttl_s": 3600, "cache_write": 6.0}})
    assert table["claude-sonnet-4"] == BUILTIN_PRICES["claude-sonnet-4"].model_copy(
        update={"cache_ttl_s": 3600.0, "cache_write": 6.0}
    )
    assert table["gpt-4.1"] == BUILTIN_PRICES["gpt-4.1"]


def test_price_table_refuses_a_bad_table_with_one_problem_per_field():
    with pytest.raises(InvalidConfiguration) as raised:
        price_table({"gpt-4.1": {"input": -1}, "new-model": {"input": 1.0}, "x": 3})
    problems = raised.value.problems
    assert any("gpt-4.1.input" in str(p) for p in problems)
    assert any("new-model.provider" in str(p) for p in problems)
    assert any(str(p).startswith("prices.x:") for p in problems)


def _whole_history(t: TraceBuilder, breakpoints: bool) -> list[FleetOutcome]:
    out: list[FleetOutcome] = []
    for i in prepare_points(t.lines):
        messages = tuple(history_of(t.lines[:i]).messages())
        out.append(FleetContext(messages, breakpoints=(1, len(messages)) if breakpoints else ()))
    return out


def test_score_trace_prices_every_system_and_the_whole_history_costs_what_full_costs() -> None:
    t = TraceBuilder().system("You are an agent. " * 200).user("Fix calc.py.")
    for i in range(6):
        t.bash(f"c{i}", f"cat calc_{i}.py", f"line of calc {i}\n" * 60)
    t.say("done")
    prices = {p: BUILTIN_PRICES[p] for p in ("gpt-4.1", "claude-sonnet-4")}
    counter = ContextCounter(counter_for("o200k_base"))
    marked = score_trace("t", t.lines, 100_000, _whole_history(t, True), counter, prices=prices)
    fleet, full = marked.systems[CTXFLEET], marked.systems["full"]
    assert fleet.costs == full.costs and set(fleet.costs) == set(prices)
    anthropic = fleet.costs["claude-sonnet-4"]
    assert anthropic.cached_tokens > 0 and anthropic.written_tokens > 0
    assert anthropic.calls == len(prepare_points(t.lines)) and anthropic.output_tokens > 0
    # Without breakpoints Anthropic caches nothing; OpenAI's automatic cache does not need them.
    unmarked = score_trace("t", t.lines, 100_000, _whole_history(t, False), counter, prices=prices)
    assert unmarked.systems[CTXFLEET].costs["claude-sonnet-4"].cached_tokens == 0
    assert unmarked.systems[CTXFLEET].costs["gpt-4.1"] == fleet.costs["gpt-4.1"]
    assert unmarked.systems[CTXFLEET].costs["claude-sonnet-4"].usd > anthropic.usd


def test_eval_command_refuses_a_bad_price_file_before_it_starts_a_fleet(tmp_path, capsys):
    from infra.cli import main

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"gpt-4.1": {"cached_input": "cheap"}}), encoding="utf-8")
    assert main(["eval", "--prices", str(prices)]) == 2
    assert "invalid_configuration" in capsys.readouterr().err
    prices.write_text("{not json", encoding="utf-8")
    assert main(["eval", "--prices", str(prices)]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["eval", "--price", "o3"]) == 2
    assert "no price for o3" in capsys.readouterr().err
