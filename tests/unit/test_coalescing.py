"""The per-thread scheduler of budgeter and indexer: coalesced passes, and a shutdown that keeps its bound."""

from __future__ import annotations

import asyncio
import logging

import pytest

from workers.coalescing import CoalescingScheduler

pytestmark = pytest.mark.anyio
log = logging.getLogger("test")


async def _no_stale() -> list[str]:
    return []


async def test_stop_cancels_a_pass_that_outlives_the_grace_and_schedules_nothing_after() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()
    passes: list[str] = []

    async def work(thread_id: str) -> None:
        passes.append(thread_id)
        started.set()
        try:
            await asyncio.sleep(60)  # a long catch-up: it commits with its position, so cancelling is safe
        except asyncio.CancelledError:
            cancelled.set()
            raise

    scheduler = CoalescingScheduler(work, _no_stale, log, sweep_s=60)
    scheduler.start()
    scheduler.schedule("r.a")
    await started.wait()
    scheduler.schedule("r.a")  # would ask for one more pass
    loop = asyncio.get_running_loop()
    begun = loop.time()
    await scheduler.stop(grace_s=0.2)
    assert loop.time() - begun < 2.0
    assert cancelled.is_set()
    scheduler.schedule("r.b")
    await asyncio.sleep(0)
    assert passes == ["r.a"] and scheduler.backlog == 0


async def test_stop_lets_a_short_pass_finish() -> None:
    finished: list[str] = []

    async def work(thread_id: str) -> None:
        await asyncio.sleep(0.05)
        finished.append(thread_id)

    scheduler = CoalescingScheduler(work, _no_stale, log, sweep_s=60)
    scheduler.schedule("r.a")
    await scheduler.stop(grace_s=5.0)
    assert finished == ["r.a"]


async def test_a_flood_of_notices_runs_bounded_passes_and_the_sweep_catches_up_what_it_dropped() -> None:
    active, peak, done = 0, 0, set()
    release = asyncio.Event()

    async def work(thread_id: str) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await release.wait()
        active -= 1
        done.add(thread_id)

    flood = [f"r{i}.main" for i in range(2_000)]

    async def stale() -> list[str]:  # the ledger says which threads really moved and are not done
        return [t for t in flood if t not in done]

    scheduler = CoalescingScheduler(work, stale, log, sweep_s=0.01, max_concurrent=4, max_pending=100)
    for thread_id in flood:
        scheduler.schedule(thread_id)
    await asyncio.sleep(0.05)
    assert peak == 4 and scheduler.backlog == 100 and scheduler.dropped == 1_900
    release.set()
    scheduler.start()
    for _ in range(500):
        if len(done) == len(flood):
            break
        await asyncio.sleep(0.01)
    await scheduler.stop()
    assert done == set(flood) and peak == 4


async def test_notices_for_a_moving_thread_collapse_into_one_pass_per_min_interval() -> None:
    loop = asyncio.get_running_loop()
    begun: list[float] = []
    first_running, second_done = asyncio.Event(), asyncio.Event()

    async def work(thread_id: str) -> None:
        begun.append(loop.time())
        first_running.set()
        await asyncio.sleep(0.01)
        if len(begun) == 2:
            second_done.set()

    scheduler = CoalescingScheduler(work, _no_stale, log, sweep_s=60, min_interval_s=0.2)
    scheduler.schedule("r.a")
    await first_running.wait()
    for _ in range(20):  # a burst of recorded batches while (and just after) the first pass runs
        scheduler.schedule("r.a")
        await asyncio.sleep(0.005)
    await asyncio.wait_for(second_done.wait(), timeout=5)
    await asyncio.sleep(0)
    # Twenty notices, one more pass — and not before the interval since the first began.
    assert len(begun) == 2 and scheduler.backlog == 0
    assert begun[1] - begun[0] >= 0.2
    await scheduler.stop()


async def test_a_thread_failing_the_same_way_every_pass_is_logged_once_until_its_failure_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors = [ValueError("too long"), ValueError("too long"), ValueError("too long"), KeyError("x"), None]
    done = asyncio.Event()

    async def work(thread_id: str) -> None:
        error = errors.pop(0)
        if not errors:
            done.set()
        if error is not None:
            raise error

    scheduler = CoalescingScheduler(work, _no_stale, log, sweep_s=60)
    with caplog.at_level(logging.DEBUG, logger="test"):
        while not done.is_set():
            scheduler.schedule("r.a")  # as the sweep does, every round, while the thread is due
            await asyncio.sleep(0.001)
        await scheduler.stop(grace_s=1.0)
    said = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records if r.levelno >= logging.INFO]
    assert said == [
        ("WARNING", "r.a: ValueError: too long"),
        ("WARNING", "r.a: KeyError: 'x'"),
        ("INFO", "r.a: done again after failing"),
    ]
    assert scheduler.failures == 4
