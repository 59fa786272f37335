"""Every budget sees the least compressed history that fits it, over a real fleet: a summary a small
budget needed is a view, not a deletion, so a larger budget on the same thread shows the records."""

from __future__ import annotations

import pytest

from contracts import PreparedContext
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread, prepare_request as _request

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

SMALL, LARGE = 4_000, 16_000
STEPS = 14  # about 330 tokens a step: the thread outgrows the small budget, never the large one
OUTGROWN = 60  # ... and here the large one too


async def _step(client: FleetClient, t: Thread, i: int) -> str:
    if i == 0:
        await client.append(t.system("Be brief."))
    await client.append(t.user(f"question {i}: " + "why does the parser drop spaces " * 5))
    key = f"answer-{i}"
    await client.append(
        t.assistant(f"answer {i}: " + "the tokenizer joins adjacent tokens without separators " * 40, key=key)
    )
    return key


async def _prepare(client: FleetClient, t: Thread, budget: int, key: str) -> PreparedContext:
    return await client.prepare(_request(t, model_profile=None, budget_tokens=budget, after_event_key=key))


def _shown(prepared: PreparedContext) -> tuple[list[object], int]:
    return [m.content for m in prepared.messages], prepared.budget_report.used.total


async def test_small_and_large_prepares_interleaved_on_one_thread_each_see_what_they_see_alone(
    fleet, client: FleetClient
) -> None:
    both, large_alone, small_alone = Thread(), Thread(), Thread()
    summarized = 0
    for i in range(STEPS):
        key = await _step(client, both, i)
        await _step(client, large_alone, i)
        await _step(client, small_alone, i)
        small = await _prepare(client, both, SMALL, key)
        large = await _prepare(client, both, LARGE, key)
        assert small.budget_report.used.total <= SMALL
        summarized += small.summary is not None
        # The small budget's summary is there, and the large budget shows the records it covers.
        assert large.summary is None and large.omitted == ()
        assert _shown(large) == _shown(await _prepare(client, large_alone, LARGE, key))
        assert _shown(small) == _shown(await _prepare(client, small_alone, SMALL, key))
    assert summarized > 0  # the thread did outgrow the small budget


async def test_a_large_budget_on_a_thread_that_outgrew_it_shows_the_earliest_summary_that_fits(
    fleet, client: FleetClient
) -> None:
    both, large_alone = Thread(), Thread()
    for i in range(OUTGROWN):
        key = await _step(client, both, i)
        await _step(client, large_alone, i)
        small = await _prepare(client, both, SMALL, key)
        large = await _prepare(client, both, LARGE, key)
        alone = await _prepare(client, large_alone, LARGE, key)
        assert large.budget_report.used.total <= LARGE and large.omitted == ()
        if alone.summary is None:
            assert _shown(large) == _shown(alone)
            continue
        # Past the large budget, the small budget's compactions left a chain of summaries, each
        # covering a longer prefix: the large budget shows the earliest whose rest fits it. Its own
        # compaction alone aims lower (the policy's target ratio), so it sees more here than alone.
        assert small.summary is not None and large.summary is not None
        assert large.summary.covered_to < small.summary.covered_to
        assert large.budget_report.used.total >= alone.budget_report.used.total
