"""Prepares first: background passes wait for a process's prepares in progress, never for long."""

from __future__ import annotations

import asyncio
import logging

import pytest

from workers.coalescing import CoalescingScheduler
from workers.hot_path import HotPath

pytestmark = pytest.mark.anyio
log = logging.getLogger("test")


async def _no_stale() -> list[str]:
    return []


async def _background_pass(hot: HotPath, order: list[str]) -> None:
    await hot.yield_to_prepares()
    order.append("background")


async def test_yield_to_prepares_returns_at_once_when_no_prepare_is_in_progress() -> None:
    hot = HotPath(max_defer_s=5.0)
    loop = asyncio.get_running_loop()
    begun = loop.time()
    await hot.yield_to_prepares()
    assert loop.time() - begun < 0.5


async def test_yield_to_prepares_lets_the_loop_run_even_when_no_prepare_is_in_progress() -> None:
    # Work done in pieces, each after this call, never holds the loop for more than one piece.
    hot = HotPath(max_defer_s=5.0)
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "request read")
    await hot.yield_to_prepares()
    assert ran == ["request read"]


async def test_yield_to_prepares_waits_until_the_last_prepare_in_progress_ends() -> None:
    hot = HotPath(max_defer_s=5.0)
    order: list[str] = []
    background = _background_pass(hot, order)

    with hot.serving():
        with hot.serving():
            task = asyncio.create_task(background)
            await asyncio.sleep(0.05)
            order.append("first prepare done")
        await asyncio.sleep(0.05)
        assert hot.active == 1
        order.append("second prepare done")
    await asyncio.wait_for(task, timeout=1.0)
    assert order == ["first prepare done", "second prepare done", "background"]


async def test_yield_to_prepares_gives_up_after_its_bound_so_back_to_back_prepares_never_starve_it() -> None:
    hot = HotPath(max_defer_s=0.05)
    loop = asyncio.get_running_loop()
    with hot.serving():
        begun = loop.time()
        await hot.yield_to_prepares()
        waited = loop.time() - begun
    assert 0.04 <= waited < 1.0


async def test_yield_to_prepares_with_no_bound_never_waits() -> None:
    hot = HotPath(max_defer_s=0.0)
    loop = asyncio.get_running_loop()
    with hot.serving():
        begun = loop.time()
        await hot.yield_to_prepares()
        waited = loop.time() - begun
        assert hot.active == 1
    assert waited < 0.05


async def test_scheduler_pass_starts_after_the_prepare_in_progress() -> None:
    hot = HotPath(max_defer_s=5.0)
    order: list[str] = []

    async def work(thread_id: str) -> None:
        order.append(f"pass {thread_id}")

    scheduler = CoalescingScheduler(work, _no_stale, log, sweep_s=60, before_pass=hot.yield_to_prepares)
    with hot.serving():
        scheduler.schedule("r.a")
        await asyncio.sleep(0.05)
        order.append("prepare answered")
    await scheduler.stop(grace_s=2.0)
    assert order == ["prepare answered", "pass r.a"]


async def test_a_pass_waits_for_a_quiet_moment_not_for_the_gap_between_two_steps() -> None:
    hot = HotPath(quiet_s=0.05, pass_defer_s=5.0)
    loop = asyncio.get_running_loop()
    passed: list[float] = []

    async def background() -> None:
        await hot.await_quiet()
        passed.append(loop.time())

    with hot.serving():
        task = asyncio.create_task(background())
        await asyncio.sleep(0.01)
    for _ in range(5):  # steps with 10 ms between them: never quiet for 50 ms
        await asyncio.sleep(0.01)
        assert not passed
        with hot.serving():
            await asyncio.sleep(0.005)
    last_answered = loop.time()
    await asyncio.wait_for(task, timeout=2.0)
    assert passed[0] - last_answered >= 0.045  # ran in the pause after the last step


async def test_a_pass_starts_at_its_bound_when_prepares_never_pause() -> None:
    hot = HotPath(quiet_s=1.0, pass_defer_s=0.1)
    loop = asyncio.get_running_loop()
    begun = loop.time()
    with hot.serving():
        await hot.await_quiet()
        waited = loop.time() - begun
    assert 0.09 <= waited < 0.5


async def test_a_pass_starts_at_once_in_a_process_that_answered_no_prepare_yet() -> None:
    hot = HotPath(quiet_s=5.0, pass_defer_s=5.0)
    loop = asyncio.get_running_loop()
    begun = loop.time()
    await hot.await_quiet()
    assert loop.time() - begun < 0.5


async def test_a_prepare_counts_as_in_progress_until_the_loop_turn_after_it_returned() -> None:
    hot = HotPath(max_defer_s=5.0)
    order: list[str] = []
    background = _background_pass(hot, order)

    with hot.serving():
        task = asyncio.create_task(background)
        await asyncio.sleep(0.01)
    # The handler has returned; FastStream queues the reply's write in this same turn.
    assert hot.active == 1
    asyncio.get_running_loop().call_soon(order.append, "reply written")
    await asyncio.sleep(0)
    assert hot.active == 0
    await asyncio.wait_for(task, timeout=1.0)
    assert order == ["reply written", "background"]
