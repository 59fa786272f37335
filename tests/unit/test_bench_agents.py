"""The agent-like steps a benchmark runs in blocks go on where the last block stopped.

``think_paired`` pools each checkout's steps over several blocks; a block that published its
sessions' events again from the start would time duplicates, which the fleet answers without
waiting for anything, and the comparison would measure nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from benchmarks.concurrency import AgentSteps, Session, agent_figures, agent_steps
from benchmarks.conversation import sample_events
from contracts import Event, PrepareRequest
from ctxfleet_client.client import FleetClient

pytestmark = pytest.mark.anyio


class _Runtime:
    """Records what each session published and which event each prepare named."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str]] = []
        self.named: list[tuple[str, str | None]] = []

    async def append(self, event: Event) -> None:
        self.published.append((event.session_id, event.event_key))

    async def prepare(self, request: PrepareRequest, **_: Any) -> None:
        self.named.append((request.session_id, request.after_event_key))
        await asyncio.sleep(0.005)


def _session(n: int) -> Session:
    events = sample_events(f"s-agents-{n}", 60, start=n)
    head = events[0]
    request = PrepareRequest(
        session_id=head.session_id, run_id=head.run_id, instance_id=head.instance_id, budget_tokens=4_000
    )
    return Session(request, events)


async def test_a_second_block_goes_on_where_the_first_stopped_and_publishes_nothing_twice() -> None:
    runtime = _Runtime()
    clients = [cast(FleetClient, runtime)]
    sessions = [_session(n) for n in range(3)]
    keys = [[(e.session_id, e.event_key) for e in s.ahead] for s in sessions]
    run = AgentSteps()

    await agent_steps(clients, sessions, 0.0, 0.05, run)
    first = len(runtime.published)
    await agent_steps(clients, sessions, 0.0, 0.05, run)

    assert 0 < first < len(runtime.published) < sum(map(len, keys))
    assert len(set(runtime.published)) == len(runtime.published)
    # Each session's events went out in order, from its first, with no gap between the blocks.
    for session_keys, session in zip(keys, sessions, strict=True):
        sent = [k for k in runtime.published if k in set(session_keys)]
        assert sent == session_keys[: len(sent)]
        assert (session.ahead[0].session_id, session.ahead[0].event_key) == session_keys[len(sent)]
    assert runtime.named == runtime.published  # every prepare named the event just published
    assert agent_figures(run, 0.1)["steps"] == len(runtime.published)
