"""Counting per provider family and overflow recovery through a real fleet."""

from __future__ import annotations

import math

import pytest

from contracts import PrepareRequest
from services.core.calibration import request_tokens_before
from ctxfleet_client.client import FleetClient
from contracts.exceptions import ProviderContextExceeded
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def _history(client: FleetClient, t: Thread, groups: int = 6) -> str:
    await client.append(t.system("You fix bugs in a Python repository."))
    await client.append(t.user("Fix the import in app.py", key="task"))
    key = "task"
    for i in range(groups):
        await client.append(
            t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat f{i}.py"}),), key=f"a{i}")
        )
        key = f"out{i}"
        await client.append(t.outcome(f"c{i}", f"contents of f{i}.py " * 60, key=key))
    return key


def _request(t: Thread, profile: dict[str, object], last: str, **fields: object) -> PrepareRequest:
    return PrepareRequest.model_validate(
        {
            "session_id": t.session_id,
            "run_id": t.run_id,
            "instance_id": t.instance_id,
            "profile": profile,
            "after_event_key": last,
            **fields,
        }
    )


async def test_a_usage_report_calibrates_an_estimate_profile_for_the_next_prepares(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    last = await _history(client, t)
    # Calibrations are kept per profile name: a name of its own keeps this test's factor apart.
    profile = {"name": f"claude-{t.run_id}", "context_window": 200_000, "encoding": "estimate"}
    first = await client.prepare(_request(t, profile, last))
    assert first.budget_report.counting_method == "tiktoken:o200k_base*calibration"
    assert (first.budget_report.calibration_factor, first.budget_report.calibration_reports) == (1.0, 0)
    response = next(s.seq for b in first.blocks for s in b.sources if s.event_key == "a5")
    local = request_tokens_before(first, response)
    assert local is not None
    usage = {"response_event_key": "a5", "input_tokens": round(local * 1.3), "view_revision": 0}
    second = await client.prepare(_request(t, profile, last, usage=usage))
    assert math.isclose(second.budget_report.calibration_factor, 1.3, abs_tol=0.01)
    assert second.budget_report.calibration_reports == 1
    third = await client.prepare(_request(t, profile, last))
    assert third.budget_report.calibration_factor == second.budget_report.calibration_factor
    assert third.budget_report.estimated_input >= round(third.budget_report.used.total * 1.29)
    assert third.budget_report.input_budget < first.budget_report.input_budget


async def test_an_overflow_gets_a_smaller_context_and_a_compaction_and_the_same_one_again_is_refused(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    last = await _history(client, t)
    profile = {"name": f"claude-tight-{t.run_id}", "context_window": 2_100, "encoding": "estimate"}
    before = await client.prepare(_request(t, profile, last))
    assert before.budget_report.reductions.masked == 0 and before.summary is None
    overflow = {
        "kind": "context_length_exceeded",
        "provider_limit": 2_100,
        "provider_count": round(before.budget_report.estimated_input * 1.4),
        "our_estimate": before.budget_report.estimated_input,
        "view_revision": before.view_revision,
    }
    after = await client.prepare(_request(t, profile, last, after_overflow=overflow))
    assert math.isclose(after.budget_report.calibration_factor, 1.4, abs_tol=0.01)
    assert after.budget_report.used.total < before.budget_report.used.total
    assert after.budget_report.estimated_input <= 2_100

    async def compacted() -> bool:
        return (await client.inspect(t.thread_id, limit=1)).summaries >= 1

    await eventually(compacted, timeout=20, what="the compaction the overflow forced")
    with pytest.raises(ProviderContextExceeded) as refused:
        await client.prepare(_request(t, profile, last, after_overflow=overflow))
    details = refused.value.details
    assert not refused.value.retryable
    assert (details["provider_count"], details["our_estimate"], details["view_revision"]) == (
        overflow["provider_count"],
        overflow["our_estimate"],
        0,
    )
