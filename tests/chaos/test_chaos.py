"""Every chaos scenario at the small scale, inside `make test` (deselect with ``-m 'not chaos'``).

Each one kills or restarts real processes while concurrent runtimes publish and prepare, then
checks the invariants listed in ``tests.chaos.scenarios``: nothing lost, stuck, duplicated or
reordered; chains and state replays verify; every invalid input, and only those, dead-lettered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import Stack
from tests.chaos.scenarios import SCALES, Scenario, run_scenario

pytestmark = [pytest.mark.anyio, pytest.mark.chaos, pytest.mark.pg, pytest.mark.nats]
SMALL = SCALES["small"]


@pytest.fixture(scope="module")
def chaos_stack() -> Iterator[Stack]:
    """Servers of the suite's own, which the scenarios may kill (never the session's)."""
    stack = Stack()
    stack.start()
    try:
        yield stack
    finally:
        stack.close()


@pytest.mark.parametrize("scenario", list(Scenario), ids=[s.value for s in Scenario])
async def test_chaos_scenario_records_every_valid_event_once_in_order_and_dead_letters_the_rest(
    scenario: Scenario, chaos_stack: Stack, tmp_path: Path
) -> None:
    report = await run_scenario(
        chaos_stack, scenario, SMALL, seed=list(Scenario).index(scenario), workdir=tmp_path
    )
    assert report.ok, (report.failures, report.notes)
    # The load and the fault really happened: a scenario that injected nothing proves nothing.
    assert report.events >= SMALL.sessions * SMALL.events
    assert report.faults >= 1
    if scenario is Scenario.POISON:
        assert len(report.dead_letter_codes) == report.invalid_sent == 10
    if scenario not in (Scenario.DUPLICATES, Scenario.POISON):
        assert report.recover_s is not None, report.notes
