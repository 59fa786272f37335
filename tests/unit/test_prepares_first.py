"""Prepares first: a process's background passes wait for its prepares in progress, and not for ever."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.app.final_checks import GatewayService
from services.store.final_checks import MemoryGatewayStore, MemoryHookGrants
from tests.fixtures.builders import Thread, assembled
from workers.coalescing import CoalescingScheduler
from workers.prepares_first import PreparesFirst

pytestmark = pytest.mark.anyio
log = logging.getLogger("test")


async def _no_stale() -> list[str]:
    return []


async def test_a_pass_woken_during_a_prepare_starts_only_after_the_prepare_is_answered() -> None:
    prepares = PreparesFirst(max_wait_s=30)
    events: list[str] = []
    ran = asyncio.Event()

    async def work(thread_id: str) -> None:
        events.append(f"pass {thread_id}")
        ran.set()

    scheduler = CoalescingScheduler(work, _no_stale, log, sweep_s=60, before_pass=prepares.before_pass)
    with prepares.serving():
        scheduler.schedule("r.a")  # the recorder's notice wakes the pass while the prepare is in progress
        for _ in range(5):
            await asyncio.sleep(0)
        events.append("answered")
    await asyncio.wait_for(ran.wait(), timeout=5)
    await scheduler.stop()

    assert events == ["answered", "pass r.a"]
    assert prepares.in_progress == 0


async def test_a_pass_waits_at_most_max_wait_for_a_process_never_without_a_prepare() -> None:
    prepares = PreparesFirst(max_wait_s=0.05)
    ran = asyncio.Event()

    async def work(thread_id: str) -> None:
        ran.set()

    scheduler = CoalescingScheduler(work, _no_stale, log, sweep_s=60, before_pass=prepares.before_pass)
    with prepares.serving():
        scheduler.schedule("r.a")
        await asyncio.wait_for(ran.wait(), timeout=5)  # ran while the prepare is still in progress
        assert prepares.in_progress == 1
    await scheduler.stop()


async def test_a_prepare_counts_as_in_progress_until_one_loop_turn_after_its_handler_returns() -> None:
    prepares = PreparesFirst()
    with prepares.serving():
        pass
    assert prepares.in_progress == 1  # its reply's write is scheduled before a pass may start
    await asyncio.sleep(0)
    assert prepares.in_progress == 0


async def test_the_gateway_write_behind_stores_nothing_until_the_prepare_in_progress_is_answered() -> None:
    prepares = PreparesFirst(max_wait_s=30)
    store = MemoryGatewayStore()
    gateway = GatewayService(store, MemoryHookGrants(), before_derive=prepares.before_pass)
    t = Thread()
    prepared = assembled(t, [t.system("You are careful."), t.user("a question")], budget_tokens=20_000)
    with prepares.serving():
        gateway.remember(prepared, "default")  # as the assembler does, before its reply is sent
        for _ in range(5):
            await asyncio.sleep(0)
        assert gateway.pending_records == 1 and not store.prepared
    await gateway.flush()
    assert list(store.prepared) == [(prepared.prepared_id, prepared.format)]
